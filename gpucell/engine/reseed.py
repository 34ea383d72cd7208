"""``--seed`` on the engines: reseed the process-wide generators before each
iteration from ``(seed, iteration)``, so the numbers drawn depend on neither
the engine nor the chunk.

Only the generators the kernel found the loop can reach are reseeded
(``gpucell.core.seeding``; ``None``: all of them): each costs 1.5-4 us per
iteration, which a cheap loop feels.  Standard library only (numpy and torch
when loaded).
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


def _key(seed: int) -> Callable[[int], int]:
    """Iteration -> its 64-bit seed: blake2b of ``f"{seed}:{i}"`` (the prefix
    encoded once)."""
    prefix = f"{seed}:".encode()
    blake = hashlib.blake2b
    from_bytes = int.from_bytes

    def key(i: int) -> int:
        digest = blake(prefix + str(i).encode(), digest_size=8).digest()
        return from_bytes(digest, "little")

    return key


def _seed_random(x: int) -> None:
    import random

    random.seed(x)


def _numpy_seeder() -> Callable[[int], None] | None:
    try:
        import numpy
    except ImportError:
        return None
    np_seed = numpy.random.seed

    def seed(x: int) -> None:
        np_seed(x % 2**32)

    return seed


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
    steps: list[Callable[[int], None]] = []
    if "random" in want:
        steps.append(_seed_random)
    numpy_seed = _numpy_seeder() if "numpy" in want else None
    if numpy_seed is not None:
        steps.append(numpy_seed)
    if "torch" in want:
        steps.append(_torch_seeder())
    key = _key(seed)
    if not steps:
        return lambda i: None
    if len(steps) == 1:  # the common case: no loop over one step
        (only,) = steps

        def seed_one(i: int) -> None:
            only(key(i))

        return seed_one

    def seed_all(i: int) -> None:
        x = key(i)
        for step in steps:
            step(x)

    return seed_all


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
