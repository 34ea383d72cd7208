"""The words of the refusals that are built from parts of the loop (the
advice that names the user's own names and lines)."""

from __future__ import annotations

import ast

from gpucell.core.analysis.sinks import BIN_OPS

__all__ = [
    "OP_TEXT",
    "REFIT_METHODS",
]


#: the await refusal's message and advice
_AWAIT_TEXT = (
    "`await`/`async` is not allowed in the parallel loop: engines run the body as "
    "plain synchronous code. ",
    "Call a synchronous function, or run the cell serially.",
)


#: the source text of every binary operator (messages quote the user's own)
OP_TEXT: dict[type[ast.operator], str] = {
    **BIN_OPS,
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.LShift: "<<",
    ast.RShift: ">>",
}


def _op_text(op: ast.operator) -> str:
    """``/`` for ``ast.Div()``: the operator as the user wrote it."""
    return OP_TEXT[type(op)]


def _element_fix(name: str) -> str:
    """Advice for ``h[k] = []`` beside ``h[k].append(x)`` (or ``+=``) that was
    not proven to be the iteration's own new element."""
    return (
        f"To fill a new element per key, make it new at the top of the loop "
        f"body, before any other use of `{name}`, under the loop variable "
        f"itself (`{name}[k] = []`, then `{name}[k].append(...)`); or build it "
        f"in a local and store it once (`h = []`, `h.append(...)`, "
        f"`{name}[k] = h`)."
    )


def _row_depth_fix(name: str) -> str:
    """The own-row form of mixed-depth row updates (numpy/torch rows)."""
    return (
        f" If each iteration changes only its own row `{name}[i]` (`i` from "
        f"`range` or `enumerate`), write every statement one level into the "
        f"row (`{name}[i, :] *= 2` beside `{name}[i, :2] += 1`): own-row writes "
        f"are accepted."
    )


def _own_key_fix(name: str, key_loop: tuple[str, str] | None = None) -> str:
    """Advice for ``for k in d: d[k] = f(d[k])``: forms that are accepted;
    ``key_loop``: the loop's variable and iterable when its items are keys
    that may repeat (``for c in cols``)."""
    if key_loop is not None and name not in _identifiers(key_loop[1]):
        k, it = key_loop
        return (
            f"`{name}[{k}]` is each iteration's own item only when no two items "
            f"of `{it}` are equal (serially a repeated key's second write would "
            f"read what the first wrote), which the cell does not show: loop "
            f"over keys that cannot repeat: `{name}.items()` (`for {k}, v in "
            f"{name}.items(): {name}[{k}] = f(v)`), `{name}.columns` (or a slice "
            f"of it, or `{name}.select_dtypes(...).columns`) for a DataFrame, "
            f"`dict.fromkeys({it})`, or a literal list of distinct keys "
            f"(`for {k} in ['a', 'b']:`); or write into another name (`new[{k}] "
            f"= f({name}[{k}])`) and apply it after the loop."
        )
    return (
        f"If each iteration reads and writes only its own item, loop over "
        f"`{name}.items()` (`for k, v in {name}.items(): {name}[k] = f(v)`) for "
        f"a dict, or `range(len({name}))` for a list or array; or write into "
        f"another name (`new[k] = f({name}[k])`) and apply it after the loop "
        f"(`for k, v in new.items(): {name}[k] = v`)."
    )


#: methods that refit an estimator (scikit-learn's, Keras', statsmodels'
#: results aside) or change its parameters in place
REFIT_METHODS = frozenset(
    {"fit", "partial_fit", "fit_transform", "fit_predict", "fit_resample",
     "set_params"}
)  # fmt: skip


def _method_name(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else ""


def _refit_text(name: str, call: ast.Call) -> tuple[str, str]:
    """The change that matters in a refused loop that refits ``name``, and
    the rewrite."""
    what = f"`{ast.unparse(call.func)}(...)`"
    if _method_name(call) == "set_params":
        serially = (
            f"every iteration changes that one object (each sees the parameters "
            f"the one before set, and after the loop `{name}` has the last)"
        )
    else:
        serially = (
            f"every iteration refits that one object (each starts from the one "
            f"before, and after the loop `{name}` is the last fit)"
        )
    return (
        f"{what} changes `{name}`, which exists before the loop: serially "
        f"{serially}, while each "
        f"engine would change only its own copy, and the run would stop when "
        f"the engines' check finds `{name}` changed. ",
        f"Make a new estimator in "
        f"each iteration (`m = sklearn.base.clone({name})`, then "
        f"`m.set_params(...)` and `m.fit(...)`, or `m = Model(...)`) and collect "
        f"what you need (`scores[k] = m.score(...)`, `models.append(m)`); a loop "
        f"over the models themselves (`for m in models: m.fit(X, y)`) runs in "
        f"parallel and writes each one back.",
    )


def _write_once_text(name: str, key: str, lines: list[int]) -> tuple[str, str]:
    """Why ``S[i] = f(S[i])`` then ``S[i] = g(S[i])`` is refused, and the
    rewrite that is accepted: one write."""
    if len(lines) > 1:
        where = f"on lines {', '.join(map(str, lines[:-1]))} and {lines[-1]}"
    else:
        where = f"in a nested loop (line {lines[0]})"
    own = f"{name}[{key}]"
    return (
        f"each iteration uses only its own `{own}`, but writes it {where} and "
        f"reads what it wrote. An engine reads `{own}` as it was before "
        f"the loop, so that runs in parallel only for plain operators on the "
        f"elements of a list or dict by position (an array would cast what it "
        f"stores, a frame align it). ",
        f"Keep the value in a local and write it "
        f"once (`v = {own}`, `v = f(v)`, `v = g(v)`, then `{own} = v`): one "
        f"write of the iteration's own item, read only before it, is accepted.",
    )


def _identifiers(text: str) -> set[str]:
    tree = ast.parse(text, mode="eval")
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def _setdefault_fix(call: ast.Call, name: str) -> str:
    """Advice for ``D.setdefault(k, []).append(v)``: the ``defaultdict`` form is
    a keyed gather; other defaults (``set()``) are built after the loop."""
    default = call.args[1] if len(call.args) == 2 else None
    k = ast.unparse(call.args[0]) if call.args else "k"
    is_list = isinstance(default, (ast.List, ast.ListComp)) or (
        isinstance(default, ast.Call)
        and isinstance(default.func, ast.Name)
        and default.func.id == "list"
    )
    if is_list:
        return (
            f"Make `{name}` a `collections.defaultdict(list)` before the loop and "
            f"write `{name}[{k}].append(...)` (or `.extend(...)`) in it: the lists "
            f"per key are gathered in iteration order."
        )
    # (a key that is not a name, `w.lower()`, cannot be a loop's target)
    target = k if k.isidentifier() else "key"
    return (
        f"Collect the pairs (`pairs.append(({k}, value))`) and run this "
        f"statement after the loop (`for {target}, value in pairs: ...`), where "
        f"it changes `{name}` itself."
    )
