"""The process-wide random generators' states, read in place: exact and cheap.

Why.  Around every chunk the engines compare the generators' states (without
``--seed``: to warn of a draw no line names; with it: to fail a chunk that
drew from a generator it did not reseed).  The public getters copy the state
through Python objects: ``random.getstate()`` builds a 625-int tuple (~19 us),
numpy's ``get_state()`` fills its 624 keys one item at a time (~33 us).  Both
generators keep their state inline in C (``random``'s in its object, numpy's
``MT19937`` at ``bit_generator.ctypes.state_address``), so the bytes are read
directly instead: ~1 us, and compared whole rather than checksummed.

Where in an object the state lies is found once per process, by looking for
the bytes the public getter describes, and checked on a private generator of
the same type (it must move with a draw and match the getter after it).
Nothing is ever written.  Where the search fails (another Python or numpy
layout), the public getters are used as before.
"""

from __future__ import annotations

import ctypes
import struct
import sys
from collections.abc import Callable, Collection
from typing import Any

__all__ = ["drew", "in_place", "states"]

#: MT19937's state: 624 32-bit words and a position (both generators)
_WORDS = 624

#: not searched yet (``None`` once searched and not found)
_UNSET: Any = object()

_random_at: Any = _UNSET
_numpy_gauss_at: Any = _UNSET


def _read(address: int, size: int) -> bytes:
    return ctypes.string_at(address, size)


# -- random ------------------------------------------------------------------


def _random_pattern(gen: Any) -> bytes:
    """``random``'s C state as the getter describes it: its index (an int)
    then the 624 words, as ``_randommodule.c`` lays them out."""
    internal = gen.getstate()[1]
    return struct.pack(f"=i{_WORDS}I", internal[-1], *internal[:-1])


def _find_random(gen: Any) -> int | None:
    """The offset of ``random.Random``'s C state in the object ``gen``."""
    size = type(gen).__basicsize__
    pattern = _random_pattern(gen)
    memory = _read(id(gen), size)
    at = memory.find(pattern)
    if at < 0 or memory.find(pattern, at + 1) >= 0:
        return None
    return at


def _locate_random(inst: Any) -> int | None:
    """Found on a private generator of ``inst``'s type, checked to follow a
    draw, then checked on ``inst`` itself."""
    try:
        probe = type(inst)(12345)
        at = _find_random(probe)
        if at is None:
            return None
        probe.random()
        if _read(id(probe) + at, 4 + 4 * _WORDS) != _random_pattern(probe):
            return None
        if _read(id(inst) + at, 4 + 4 * _WORDS) != _random_pattern(inst):
            return None
        return at
    except Exception:  # noqa: BLE001 - another layout: the getter is used
        return None


def _view(address: int, size: int) -> memoryview:
    """The bytes at ``address``, viewed in place: each ``bytes(view)`` is one
    copy in C (~0.3 us; through ``ctypes.string_at`` a chunk's cold call
    took ~25 us each)."""
    return memoryview((ctypes.c_char * size).from_address(address))


#: ``random``'s instance and the view of its state (``None``: not found)
_random_view: list[Any] = [None, None]


def _random_state(rnd: Any) -> Any:
    global _random_at
    inst = getattr(rnd, "_inst", None)
    if type(inst) is not getattr(rnd, "Random", None):
        return hash(rnd.getstate())
    if _random_view[0] is not inst:
        if _random_at is _UNSET:
            _random_at = _locate_random(inst)
        if _random_at is None:
            return hash(rnd.getstate())
        _random_view[:] = [inst, _view(id(inst) + _random_at, 4 + 4 * _WORDS)]
    return (bytes(_random_view[1]), inst.gauss_next)


# -- numpy -------------------------------------------------------------------


def _find_gauss(rs: Any) -> int | None:
    """The offset in a legacy ``RandomState`` of its cached Gaussian
    (``has_gauss`` then ``gauss``, 16 bytes): its ``_aug_state`` starts with
    a pointer to its own copy of the bit generator's struct, whose first
    field is the state's address."""
    size = type(rs).__basicsize__
    memory = _read(id(rs), size)
    word = struct.Struct("=Q")
    state = word.pack(rs._bit_generator.ctypes.state_address)
    own = memory.find(state)
    if own < 0 or own % 8 or memory.find(state, own + 8) >= 0:
        return None
    aug = memory.find(word.pack(id(rs) + own))
    if aug < 0 or aug % 8 or aug + 24 > size:
        return None
    return aug + 8


def _gauss_matches(rs: Any, at: int) -> bool:
    _, _, _, has_gauss, gauss = rs.get_state()
    return _read(id(rs) + at, 16) == struct.pack("=i4xd", has_gauss, gauss)


def _locate_gauss(rs: Any) -> int | None:
    """Found on a private ``RandomState``, checked with a Gaussian cached and
    without, then on ``rs`` itself."""
    try:
        import numpy

        if type(rs._bit_generator) is not numpy.random.MT19937:
            return None
        probe = type(rs)(12345)
        at = _find_gauss(probe)
        if at is None or not _gauss_matches(probe, at):
            return None
        probe.standard_normal()  # two made, one cached
        if probe.get_state()[3] != 1 or not _gauss_matches(probe, at):
            return None
        probe.standard_normal()
        if not _gauss_matches(probe, at) or not _gauss_matches(rs, at):
            return None
        return at
    except Exception:  # noqa: BLE001 - another layout: the getter is used
        return None


#: numpy's global generator, its bit generator and the views of its MT19937
#: state and cached Gaussian, while that bit generator is the one it draws from
_numpy_views: list[Any] = [None, None, None, None]


def _numpy_state(np: Any) -> Any:
    global _numpy_gauss_at
    rs = np.random.mtrand._rand
    bg = rs._bit_generator
    if _numpy_views[0] is not rs or _numpy_views[1] is not bg:
        if _numpy_gauss_at is _UNSET:
            _numpy_gauss_at = _locate_gauss(rs)
        if _numpy_gauss_at is None or type(bg) is not np.random.MT19937:
            import zlib

            return zlib.crc32(np.random.get_state()[1].tobytes())
        _numpy_views[:] = [
            rs,
            bg,
            _view(bg.ctypes.state_address, 4 * _WORDS + 4),
            _view(id(rs) + _numpy_gauss_at, 16),
        ]
    return (id(bg), bytes(_numpy_views[2]), bytes(_numpy_views[3]))


def in_place() -> dict[str, bool]:
    """Whether each generator's state is read in place (else by its getter:
    right, ~30 times slower)."""
    states()
    return {"random": _random_view[0] is not None, "numpy": _numpy_views[0] is not None}


# -- all of them ---------------------------------------------------------------


def _torch_state(torch: Any) -> Any:
    return torch.random.default_generator.get_state().numpy().tobytes()


_READERS: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    ("random", _random_state),
    ("numpy", _numpy_state),
    ("torch", _torch_state),
)


def states(skip: Collection[str] = ()) -> dict[str, Any]:
    """Each loaded process-wide generator's state (``random``, numpy's legacy
    global one, torch's CPU default), but those in ``skip``: values equal
    (``==``) exactly when the states are."""
    out: dict[str, Any] = {}
    for name, read in _READERS:
        module = sys.modules.get(name)
        if module is None or name in skip:
            continue
        try:
            out[name] = read(module)
        except Exception:  # noqa: BLE001 - (an exotic build): not checked
            pass
    return out


def drew(before: dict[str, Any] | None) -> list[str]:
    """The generators in ``before`` whose state has changed since."""
    if before is None:
        return []
    after = states([name for name, _ in _READERS if name not in before])
    return sorted(k for k, v in before.items() if after.get(k) != v)
