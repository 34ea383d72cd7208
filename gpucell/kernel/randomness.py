"""Warnings about numbers that would differ from a serial run: draws from a
process-wide random generator (each engine has its own) and a set's order
given to something ordered (each engine has its own hash seed).

They warn and let the loop run: the user may accept other random numbers, and
``--seed`` makes them reproducible.  (Shown with ``--quiet`` too: they say the
results will differ, not how the run went.)
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpucell.core.analysis import LoopPlan

__all__ = ["warn_hidden_draws", "warn_random", "warn_set_order"]


def warn_random(
    plan: LoopPlan, seed: int | None, inputs: dict[str, Any], ns: dict[str, Any]
) -> str:
    """Say when iterations draw from a process-wide random generator: in the
    loop's own text, in a notebook function it calls, or in a torch model in
    training mode with dropout.  Returns what was said ("seeded", "reseeds",
    "warned" or "") so the merge does not say it again."""
    if seed is not None:
        return "seeded"
    draws, models = _draws(plan, inputs, ns)
    seeds = [(n, c) for n, c in plan.random_calls if _seeds(c)]
    if (
        seeds
        and seeds[0][0] in plan.facts.top_expressions
        and all(n > seeds[0][0] for n, _ in draws)
    ):
        _say_reseeded(plan, *seeds[0])
        return "reseeds"
    calls = [text for _, text in sorted(draws)] + [
        f"`{c}` (line {n})" for n, c in seeds
    ]
    if not calls:
        return ""
    hint = (
        f" (`{models[0]}` only evaluated in the loop: call `{models[0]}.eval()` "
        "before it)"
        if models
        else ""
    )
    print(
        f"gpucell: warning: {', '.join(calls)} draw(s) from a global random "
        "generator: each engine's is its own, so the numbers differ from a "
        "serial run and with the number of engines. `%%gpu_parallel --seed S` "
        f"makes them depend only on S and the iteration{hint}."
    )
    return "warned"


def _draws(
    plan: LoopPlan, inputs: dict[str, Any], ns: dict[str, Any]
) -> tuple[list[tuple[int, str]], list[str]]:
    """``(line, text)`` of each draw (seeds in the body apart), and the names
    of torch models in training mode that draw."""
    from gpucell.core.globalreads import global_random_calls
    from gpucell.protocol.globalrng import global_generator

    lines = {info.name: info.line for info in plan.names}
    draws = [(n, f"`{c}` (line {n})") for n, c in plan.random_calls if not _seeds(c)]
    draws += [
        (
            lines.get(via, 0),
            f"`{call}` in `{fn}` (called at line {lines.get(via, '?')})",
        )
        for via, fn, call in global_random_calls(inputs, ns)
    ]
    # a generator's method bound before the loop (`from numpy.random import rand`)
    draws += [
        (lines.get(name, 0), f"`{name}` (line {lines.get(name, '?')})")
        for name, value in inputs.items()
        if global_generator(value) is not None
    ]
    models = [name for name, value in inputs.items() if _draws_in_training(value)]
    draws += [
        (
            lines.get(name, 0),
            f"`{name}`'s dropout in training mode (line {lines.get(name, '?')})",
        )
        for name in models
    ]
    return draws, models


def _say_reseeded(plan: LoopPlan, line: int, call: str) -> None:
    """Every iteration reseeds before it draws: its numbers are the serial
    ones; only the kernel's generator is not where the loop left it."""
    after = plan.facts.epilogue_draw
    if after is not None:
        print(
            f"gpucell: warning: each iteration seeds its generator (`{call}`, "
            f"line {line}), so the loop's numbers are those of a serial run, but "
            f"the kernel's generator is left as it was before the cell, and "
            f"`{after[1]}` after the loop (line {after[0]}) draws other numbers "
            "than serially. Reseed right after the loop."
        )
        return
    print(
        f"gpucell: note: each iteration seeds its generator (`{call}`, line "
        f"{line}) before drawing, so its numbers are those of a serial run; "
        "the kernel's generator is left as it was before the cell, not where "
        "the last iteration left it (reseed before drawing in a later cell)."
    )


def warn_set_order(plan: LoopPlan) -> None:
    """A set's order given to something ordered in the body (``list(set(words))``):
    for strings it follows the process's hash seed, and each engine has its
    own (unless ``PYTHONHASHSEED`` fixes it for the kernel, whose environment
    the engines it starts inherit)."""
    if os.environ.get("PYTHONHASHSEED", "random") != "random":
        return
    lines = plan.facts.set_orders
    if lines:
        where = ", ".join(map(str, lines))
        print(
            f"gpucell: warning: line(s) {where} give a set's order to something "
            "ordered (a list, a join, a loop): a set of strings iterates in an "
            "order that follows each process's hash seed, so each engine's can "
            "differ from a serial run's. Sort it (`sorted(...)`), or keep "
            "first-seen order with `list(dict.fromkeys(...))`."
        )


def warn_hidden_draws(drew: set[str]) -> None:
    """The engines saw the loop draw from a process-wide generator that no
    line of the cell names (a library's own draw: ``DataLoader(shuffle=True)``,
    a layer's initialisation, an estimator without ``random_state``)."""
    names = {"random": "`random`'s", "numpy": "numpy's", "torch": "torch's"}
    which = " and ".join(names.get(g, g) for g in sorted(drew))
    print(
        f"gpucell: warning: the loop drew from {which} global random generator "
        "inside a call (an unseeded DataLoader(shuffle=True), a layer's "
        "initialisation, an estimator without random_state...): each engine's "
        "generator is its own, so the numbers differ from a serial run and with "
        "the number of engines. `%%gpu_parallel --seed S` makes them depend only "
        "on S and the iteration; or seed at the top of the loop body."
    )


def _seeds(call: str) -> bool:
    """``random.seed``, ``np.random.seed``, ``torch.manual_seed``: a call that
    resets a global generator rather than drawing from it."""
    return call.rsplit(".", 1)[-1] in ("seed", "manual_seed")


def _draws_in_training(value: Any) -> bool:
    """A torch module in training mode with a layer that draws random numbers
    on every call (dropout with p > 0, RReLU)."""
    torch = sys.modules.get("torch")
    nn = getattr(torch, "nn", None)
    if nn is None or not isinstance(value, nn.Module) or not value.training:
        return False
    dropout = getattr(getattr(nn.modules, "dropout", None), "_DropoutNd", None)
    rrelu = getattr(nn, "RReLU", None)
    for m in value.modules():
        if not m.training:
            continue
        if (
            isinstance(dropout, type)
            and isinstance(m, dropout)
            and getattr(m, "p", 0) > 0
        ):
            return True
        if isinstance(rrelu, type) and isinstance(m, rrelu):
            return True
    return False
