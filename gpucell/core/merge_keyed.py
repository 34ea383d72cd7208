"""Keyed merges: keyed reductions (``D[k] += e``, a keyed max/min), whose
per-key partials are combined in chunk order and applied in the order keys
were first seen, and keyed gathers (``D[k].append(e)``), whose items are
extended onto each key's list in iteration order.  What the serial stores
would do differently (a cast per store, a nan that hid values, two keys of
one element or one list) is refused before anything changes.  Pure.
"""

from __future__ import annotations

import operator
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from gpucell.core.merge_base import ChunkResultLike, Merging, Mutation
from gpucell.core.merge_inplace import check_array_write, plan_inplace
from gpucell.core.reducers import selects
from gpucell.errors import NotParallelizable
from gpucell.protocol.fold import (
    BINARY,
    INPLACE,
    fold,
    is_numpy,
    is_torch,
    own,
    unordered,
)

__all__ = ["merge_keyed", "merge_keyed_gathers"]


def merge_keyed(m: Merging) -> None:
    """Keyed reductions: per-key partials combined in chunk order."""
    for name, op in m.plan.keyed:
        chunks = [r.keyed[name][1] for r in m.rs if name in r.keyed]
        first_nan = _select_nans(name, op, chunks)
        entries = _combine_keyed(op, chunks)
        if not entries:
            continue
        target = m.existing(name)
        m.claim(name, target)
        facts = getattr(m.plan, "facts", None)
        once = name in getattr(facts, "stored_once", ())
        stores = [st for st in getattr(facts, "subscript_stores", ()) if st[0] == name]
        keys = "` or `".join(dict.fromkeys(key for *_s, key in stores))
        written = " and ".join(
            f"`{text}` (line {line})" for _n, line, text, _k in stores
        )
        written += f": the key `{keys}`" if stores else ""
        m.up.mutations.extend(
            _prepare_keyed(
                name, target, op, entries, m.spelled, once, first_nan, written
            )
        )


def _combine_keyed(op: str, chunks: list[list[tuple[Any, Any]]]) -> list[list[Any]]:
    """Per-key partials of all chunks, folded in chunk order, in first-seen order."""
    entries: list[list[Any]] = []
    index: dict[Any, int] = {}
    for chunk in chunks:
        for k, p in chunk:
            try:
                pos = index.get(k)
                hashable = True
            except TypeError:
                pos, hashable = None, False
            if pos is None:
                if hashable:
                    index[k] = len(entries)
                entries.append([k, own(op, p)])
            else:
                entries[pos][1] = fold(op, entries[pos][1], p)
    return entries


def _select_nans(name: str, op: str, chunks: list[list[tuple[Any, Any]]]) -> list[Any]:
    """A keyed max/min's keys whose first chunk's partial is nan (unordered).

    On an engine a nan that comes first stays (``max(nan, x)`` is nan) and
    hides what came after it in the chunk; serially it stays only where it
    is the key's first value (``if k not in D or v > D[k]``).  A nan partial
    after the first is refused here; the first is checked against the key's
    starting value by ``_prepare_keyed``."""
    if not selects(op):
        return []
    seen: list[Any] = []
    nans: list[Any] = []
    for chunk in chunks:
        for k, p in chunk:
            if unordered(p):
                if any(k == s for s in seen):
                    raise NotParallelizable(
                        f"gpucell: `{name}[{k!r}] = {op}(...)` met a nan after "
                        f"other values of the key: on its engine it hid the "
                        f"values after it, which serially still count. "
                        f"Nothing was merged."
                    )
                nans.append(k)
            seen.append(k)
    return nans


def _prepare_keyed(
    name: str,
    target: Any,
    op: str,
    entries: list[list[Any]],
    spelled: Any = None,
    once: bool = False,
    first_nan: Sequence[Any] = (),
    written: str = "",
) -> list[Mutation]:
    """``spelled`` (``analysis.spellings.Spelled``): a missing key's starting
    value (``D.get(k, 0) + e``), and whether the statements rebind
    (``D[k] = D[k] + e``: the binary operator, a new object as serially).
    ``once``: each key was stored by exactly one iteration's one statement
    (``LoopFacts.stored_once``), so an array's store is replayed as serially."""
    muts: list[Mutation] = []
    is_array = is_numpy(target) or is_torch(target)
    if is_array or isinstance(target, list):
        entries = _one_entry_per_position(name, op, target, entries, written)
    defaults = getattr(spelled, "defaults", {})
    rebinding = name in getattr(spelled, "rebinding", ())
    mixed = name in getattr(spelled, "mixed", ())
    first = name in getattr(spelled, "first", ())
    for k, c in entries:
        if isinstance(target, dict) and first and k not in target:
            # `if k not in D or v > D[k]: D[k] = v`: the key's first value
            muts.append(Mutation(name, f"[{k!r}] = {op}", _setter(target, k, c)))
            continue
        if any(k == n for n in first_nan) and not unordered(_base_of(target, k)):
            raise NotParallelizable(
                f"gpucell: `{name}[{k!r}] = {op}(...)` met a nan first on an "
                "engine, where it hid the values after it; serially the key's "
                "value before it keeps them. Nothing was merged."
            )
        if isinstance(target, dict):
            if k in target:
                base = target[k]
            elif name in defaults:  # (before a defaultdict's factory: get's)
                base = defaults[name]
            elif isinstance(target, defaultdict) and target.default_factory is not None:
                base = target.default_factory()
            elif isinstance(target, Counter):
                base = 0
            else:
                raise KeyError(
                    f"{k!r}: `{name}[{k!r}] {op}= ...` needs the key to exist (use a "
                    f"collections.defaultdict or Counter). Nothing was merged."
                )
        else:
            base = target[k]
        if mixed and not isinstance(base, (int, float, complex, str, bytes)):
            raise NotParallelizable(
                f"`{name}[{k!r}]` is a {type(base).__name__}, changed in place by "
                f"`{name}[k] {op}= ...` and rebound by `{name}[k] = {name}[k] {op} "
                "...` in the loop: serially the two differ for such a value. Use "
                "one form. Nothing was merged."
            )
        if (selects(op) and not (is_array and once)) or (rebinding and not is_array):
            new: Any = BINARY[op](base, c)
            action: Callable[[], Any] = _returner(new)
        elif is_array and once and not _holds_objects(target):
            new = _replay_array_store(target, k, op, c, rebinding or selects(op))
            action = _returner(new)
        elif is_array:
            new = BINARY[op](base, c)
            _refuse_a_cast_per_store(name, k, op, target, new)
            new = check_array_write(target, k, new)
            action = _returner(new)
        else:
            new, action = plan_inplace(f"{name}[{k!r}]", base, op, c)

        def apply(k: Any = k, action: Callable[[], Any] = action) -> None:
            target[k] = action()

        muts.append(Mutation(name, f"[{k!r}] {op}=", apply))
    return muts


def _one_entry_per_position(
    name: str, op: str, target: Any, entries: list[list[Any]], written: str = ""
) -> list[list[Any]]:
    """A sequence's keys as positions: ``y[-1]`` and ``y[2]`` of a 3-element
    list are one element, which serially gets both contributions, so their
    partials are folded into one entry (each entry is computed from the value
    before the merge).  A key that is not a position (a slice, a mask, an
    index array) may overlap another iteration's: refused, nothing merged."""
    shape = tuple(target.shape) if hasattr(target, "shape") else (len(target),)
    merged: list[list[Any]] = []
    at: dict[tuple[int, ...], int] = {}
    for k, c in entries:
        parts = k if isinstance(k, tuple) else (k,)
        try:
            if len(parts) > len(shape):
                raise TypeError
            pos = tuple(
                _position(operator.index(p), n)
                for p, n in zip(parts, shape, strict=False)
            )
        except IndexError:
            raise IndexError(
                f"`{name}[{k!r}]`: index out of range for a `{name}` of shape "
                f"{shape}, as serially. Nothing was merged."
            ) from None
        except TypeError:
            # named as the cell writes it (`written`: the statements), not by
            # the key's value, which may be a long array
            what = written or f"`{name}[...] {op}= ...`: a key"
            raise NotParallelizable(
                f"{what} is a `{type(k).__name__}`, not one position of "
                f"`{name}` (a slice, a mask or an index array may cover elements "
                "another iteration's key covers, which serially get both "
                "contributions). Key it by single positions, or gather the "
                "contributions in a dict and add them after the loop. Nothing was "
                "merged."
            ) from None
        if pos in at:
            merged[at[pos]][1] = fold(op, merged[at[pos]][1], c)
        else:
            at[pos] = len(merged)
            merged.append([k, c])
    return merged


def _position(i: int, n: int) -> int:
    """``i`` as a position in ``range(n)`` (a negative one counted from the end)."""
    if not -n <= i < n:
        raise IndexError(i)
    return i + n if i < 0 else i


def _refuse_a_cast_per_store(name: str, k: Any, op: str, target: Any, new: Any) -> None:
    """A keyed reduction into an array stores each key once, its contributions
    folded; serially every iteration's store casts to the array's dtype.  The
    two agree (to rounding) while the folded value keeps the array's kind; a
    float into an int array (or a complex into a float one) is cut at each
    store serially (``y[0] += 0.5`` twice on ints stays 1), once here."""
    if is_numpy(target):
        import numpy as np

        kind: str = target.dtype.kind
        got: str = np.asarray(new).dtype.kind
    else:
        kind, got = _torch_kind(target), _torch_kind(new)
    order = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}
    if order.get(got, 9) > order.get(kind, 9):
        raise NotParallelizable(
            f"`{name}[{k!r}] {op}= ...`: the values combined into `{name}` are of "
            f"another kind ({got!r}) than its dtype ({kind!r}), so serially each "
            "iteration's store casts them, and folding a key's contributions first "
            "can differ. Gather the contributions in a dict (`parts[k] = "
            f"parts.get(k, 0) + e`) and add them into `{name}` after the loop, or "
            f"make `{name}` of the values' dtype before it. Nothing was merged."
        )


def _replay_array_store(target: Any, k: Any, op: str, c: Any, binary: bool) -> Any:
    """``target[k] op= c`` as the serial statement runs it, on a copy: read
    the element or view, apply the operator (in place on a view, which raises
    where the result's dtype cannot be cast back, as ``img[b] += 0.5`` does on
    an int image; rebinding on a numpy scalar, which casts at the store:
    ``y[i] += 0.5`` on ints stores the truncated value), then the store's own
    cast into a scratch of the element's dtype.  Returns that scratch, which
    the commit stores unchanged, so it cannot fail half-way."""
    view = target[k]
    if is_numpy(target):
        import numpy as np

        if not target.flags.writeable:
            raise ValueError("assignment destination is read-only")
        tmp = view.copy() if isinstance(view, np.ndarray) else view
        new = BINARY[op](tmp, c) if binary else INPLACE[op][1](tmp, c)
        scratch = np.empty(np.shape(view), dtype=target.dtype)
        scratch[...] = new
        return scratch
    import torch

    if target.requires_grad and target.is_leaf and torch.is_grad_enabled():
        raise RuntimeError(
            "a leaf tensor that requires grad cannot be written in place"
        )
    if is_torch(c) and c.device != target.device:
        c = c.to(target.device)
    tmp = view.clone()
    new = BINARY[op](tmp, c) if binary else INPLACE[op][1](tmp, c)
    tscratch = torch.empty_like(view)
    tscratch[...] = new
    return tscratch


def _holds_objects(target: Any) -> bool:
    """A numpy array of dtype object: its elements are the objects themselves
    (a list ``+=`` extends in place), so the replay on a copy would not be one."""
    return is_numpy(target) and target.dtype.kind == "O"


def _torch_kind(x: Any) -> str:
    """numpy's dtype kind letter for a tensor or a Python number."""
    if hasattr(x, "is_complex"):
        return "c" if x.is_complex() else "f" if x.is_floating_point() else "i"
    return "c" if isinstance(x, complex) else "f" if isinstance(x, float) else "i"


def _returner(value: Any) -> Callable[[], Any]:
    """A commit action that just returns ``value`` (computed and checked already)."""

    def action() -> Any:
        return value

    return action


def _setter(target: Any, k: Any, value: Any) -> Callable[[], None]:
    def apply() -> None:
        target[k] = value

    return apply


def _base_of(target: Any, k: Any) -> Any:
    """The value under ``k`` before the merge (None where there is none)."""
    try:
        return target[k] if not isinstance(target, dict) or k in target else None
    except Exception:
        return None


def merge_keyed_gathers(m: Merging) -> None:
    """``D[k].append(e)`` / extend, per key in iteration order."""
    plan = m.plan
    for name in getattr(plan, "keyed_gathers", ()):
        runs = m.concat("keyed_gathers", name)
        if not runs:
            continue
        target = m.existing(name)
        m.claim(name, target)
        keyed = dict(plan.keyed)
        reduced = [k for k, _ in _keys_of(m.rs, name)] if name in keyed else []
        spelled = m.spelled
        new_lists = spelled is not None and name in spelled.new_lists
        m.up.mutations.append(
            _prepare_keyed_gather(name, target, runs, reduced, new_lists)
        )


def _keys_of(rs: Sequence[ChunkResultLike], name: str) -> list[tuple[Any, Any]]:
    """The (key, partial) entries a keyed reduction of ``name`` recorded."""
    return [e for r in rs if name in r.keyed for e in r.keyed[name][1]]


def _prepare_keyed_gather(
    name: str,
    target: Any,
    runs: list[tuple[Any, list[Any]]],
    reduced: list[Any],
    new_lists: bool = False,
) -> Mutation:
    """``D[k].append(e)``: the items for each key, in iteration order, extended
    onto the list already under that key (which must exist, as serially), or
    (``new_lists``: ``D.setdefault(k, []).append(e)``) onto a new list put
    under a key missing, in the order keys were first seen."""
    groups: list[tuple[Any, list[Any]]] = []
    for key, items in runs:
        for k, acc in groups:
            if k is key or k == key:
                acc.extend(items)
                break
        else:
            groups.append((key, list(items)))
    for key, _items in groups:
        if any(key is r or key == r for r in reduced):
            raise NotParallelizable(
                f"`{name}[{key!r}]` is both reduced (`+=`) and appended to in the "
                "loop; serially the two would interleave on one object. Use separate "
                "keys (or names) for counts and lists. Nothing was merged."
            )
        if new_lists and isinstance(target, dict) and key not in target:
            continue  # (a new list: shared with no other key)
        try:
            lst = target[key]
        except (KeyError, IndexError) as e:
            raise type(e)(
                f"`{name}[{key!r}]` does not exist, so `{name}[{key!r}].append(...)` "
                "would fail serially too; create it before the loop. Nothing was "
                "merged."
            ) from None
        if any(target[k] is lst for k, _ in groups if k is not key and k != key):
            raise NotParallelizable(
                f"`{name}[{key!r}]` is the same list as another key's, so serially "
                "the appends under both keys would interleave on it. Give each key "
                "its own list before the loop. Nothing was merged."
            )
        if not hasattr(lst, "extend"):
            raise TypeError(
                f"`{name}[{key!r}]` is a {type(lst).__name__}, which has no extend(); "
                "nothing was merged."
            )

    missing = [
        key
        for key, _ in groups
        if new_lists and isinstance(target, dict) and key not in target
    ]

    def apply() -> None:
        for key, items in groups:
            if any(key is m for m in missing):
                target[key] = []
            target[key].extend(items)

    return Mutation(name, "extend", apply)
