"""``--seed`` on the engines: reseed the process-wide generators before each
iteration from ``(seed, iteration)``, so the numbers drawn depend on neither
the engine nor the chunk.

Only the generators the kernel found the loop can reach are reseeded
(``gpucell.core.seeding``; ``None``: all of them): each costs 1.5-5 us per
iteration, which a cheap loop feels (numpy's: ~1.2 us of it is MT19937's own
seeding of its 624 words, which an exact reseed cannot skip).  Standard
library only (numpy and torch when loaded).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["GENERATORS", "seeder", "unreseeded_draw"]

#: what ``--seed`` knows how to reseed (``gpucell.core.seeding.ALL``)
GENERATORS = frozenset({"random", "numpy", "torch"})


#: keys made at once when an iteration's is not made yet: a chunk's first
#: block is small (a costly loop runs few iterations a chunk), each next one
#: twice the last, up to this
_BLOCK = 1024

#: numpy's legacy seeding takes 32 bits: the key's low ones (``x % 2**32``)
_NUMPY_BITS = 0xFFFFFFFF


def _keyed(seed: int, call: Callable[[int], Any], mask: int) -> Callable[[int], None]:
    """``seed_fn(i)``: ``call(key & mask)``, the key of iteration ``i`` being
    blake2b of ``f"{seed}:{i}"`` (8 bytes, little-endian).  Keys are made a
    block at a time from a copy of the prefix's hash (~0.4 us a key, where
    hashing each whole string took ~0.65) and ``call`` is reached without
    another Python frame: numpy's ``seed`` is called as it is."""
    prefix = hashlib.blake2b(f"{seed}:".encode(), digest_size=8).copy
    from_bytes = int.from_bytes
    block: list[int] = []
    first = [0]

    def make(i: int) -> None:
        made = []
        for j in range(i, i + min(max(16, 2 * len(block)), _BLOCK)):
            h = prefix()
            h.update(b"%d" % j)
            made.append(from_bytes(h.digest(), "little") & mask)
        block[:] = made
        first[0] = i

    def seed_fn(i: int) -> None:
        at = i - first[0]
        if at < 0 or at >= len(block):
            make(i)
            at = 0
        call(block[at])

    return seed_fn


def _seed_random() -> Callable[[int], None]:
    """``random.seed(x)`` for an int ``x``: its C seeding and the cached
    Gaussian dropped, what ``Random.seed`` does for an int, without its
    Python frame (~5 us instead of ~6.7)."""
    import _random
    import random

    inst = random._inst
    if type(inst) is not random.Random:
        return random.seed
    c_seed = _random.Random.seed

    def seed(x: int) -> None:
        c_seed(inst, x)
        inst.gauss_next = None  # type: ignore[attr-defined]

    return seed


def _numpy_seed() -> Callable[[int], None] | None:
    """``np.random.seed``, which seeds the one global ``RandomState`` that every
    ``np.random`` function (and a ``rand`` bound before the loop) draws from:
    ~1.5 us, of which MT19937's own seeding is ~1.2."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy.random.seed


def _torch_seeder() -> Callable[[int], None]:
    """Torch's generators once torch is loaded (a loop may import it); whether
    this is a GPU engine is read once, not per iteration (~0.8 us)."""
    gpu = os.environ.get("GPUCELL_DEVICE_KIND") == "gpu"

    def seed(x: int) -> None:
        torch = sys.modules.get("torch")
        if torch is None:
            return
        s = x % 2**63
        torch.random.default_generator.manual_seed(s)
        if gpu or torch.cuda.is_initialized():
            torch.cuda.manual_seed_all(s)

    return seed


def seed_torch(torch: Any, s: int) -> None:
    """What ``torch.manual_seed`` seeds that an engine can draw from: the CPU
    generator, and CUDA's on a GPU engine (queued by torch until CUDA starts).
    ``torch.manual_seed`` itself also walks every other backend (MPS, XPU,
    custom devices): ~70 us per iteration that a numpy-only loop paid."""
    torch.random.default_generator.manual_seed(s)
    if os.environ.get("GPUCELL_DEVICE_KIND") == "gpu" or torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(s)


def seeder(seed: int, generators: Iterable[str] | None = None) -> Callable[[int], None]:
    """``seed_fn(i)``: reseed ``generators`` (``random``, ``numpy``,
    ``torch``; ``None``: all) from ``(seed, i)`` before iteration ``i``."""
    want = GENERATORS if generators is None else frozenset(generators)
    if not want <= GENERATORS:
        raise ValueError(
            f"gpucell: cannot reseed {sorted(want - GENERATORS)}: --seed knows "
            f"{sorted(GENERATORS)}"
        )
    steps: list[tuple[Callable[[int], Any], int]] = []
    if "random" in want:
        steps.append((_seed_random(), -1))
    numpy_seed = _numpy_seed() if "numpy" in want else None
    if numpy_seed is not None:
        steps.append((numpy_seed, _NUMPY_BITS))
    if "torch" in want:
        steps.append((_torch_seeder(), -1))
    if not steps:
        return lambda i: None
    if len(steps) == 1:  # the common case: the step called with its key
        return _keyed(seed, *steps[0])

    def seed_all(x: int) -> None:
        for step, mask in steps:
            step(x & mask)

    return _keyed(seed, seed_all, -1)


def unreseeded_draw(drew: list[str]) -> RuntimeError:
    """The chunk drew from generators the kernel found the loop cannot reach,
    so they were not reseeded: its numbers would not be the serial seeded
    ones.  Failing the run (nothing merged) keeps that from passing silently."""
    names = ", ".join(f"`{d}`" for d in drew)
    return RuntimeError(
        f"gpucell: --seed: the loop drew from {names}'s global generator, which "
        "gpucell did not expect it to reach and so did not reseed: its numbers "
        "would differ from the serial ones. Nothing was merged. Please report "
        "this loop; meanwhile seed that generator at the top of the loop body."
    )
