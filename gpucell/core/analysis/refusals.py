"""The refusals as message classes, one per kind, as pyflakes' ``messages.py``
has one per warning: each class names its kind (docs/refusals.md has a
section for each), and holds the template of what goes wrong and of the
rewrite it advises; an instance carries the line, column, name and the
template's arguments.  A call site says which refusal it makes and with what,
not how the words go (tests/test_refusal_classes.py).

The words are the templates' and users read them as they were: ``text`` is
``message`` then ``advice``, each separator inside the templates.
"""

from __future__ import annotations

from typing import ClassVar

from gpucell.core.analysis.diagnostics import Diagnostic

__all__ = ["REFUSALS", "Refusal", "class_name"]


class Refusal(Diagnostic):
    """One refusal; subclasses set :attr:`KIND`, :attr:`MESSAGE`, :attr:`ADVICE`.

    ``MESSAGE`` and ``ADVICE`` are ``str.format`` templates over ``name`` and
    the keyword arguments given to the constructor."""

    KIND: ClassVar[str] = ""
    MESSAGE: ClassVar[str] = "{what}"
    ADVICE: ClassVar[str] = "{fix}"

    def __init__(self, line: int, col: int, name: str, **args: str) -> None:
        given = tuple(sorted(args.items()))
        text = self._message(name, args) + self._advice(name, args)
        super().__init__(line, col, name, self.KIND, text, given)

    @classmethod
    def _message(cls, name: str, args: dict[str, str]) -> str:
        return cls.MESSAGE.format(name=name, **args)

    @classmethod
    def _advice(cls, name: str, args: dict[str, str]) -> str:
        return cls.ADVICE.format(name=name, **args)

    @property
    def message(self) -> str:
        """What would go wrong in parallel."""
        return self._message(self.name, dict(self.args))

    @property
    def advice(self) -> str:
        """The rewrite that runs (with its leading separator)."""
        return self._advice(self.name, dict(self.args))


class LoopCarried(Refusal):
    """An iteration reads what an earlier iteration assigned."""

    KIND = "loop-carried"
    MESSAGE = "{why} Iterations run independently in parallel. "


class SinkRead(Refusal):
    """A name the loop combines across iterations is also read in it."""

    KIND = "sink-read"


class OuterMutation(Refusal):
    """An object from before the loop changed in place."""

    KIND = "outer-mutation"
    MESSAGE = (
        "{what} changes an object in place; {owner}, and each engine would "
        "change only its own copy, so the change would be lost in your "
        "namespace (and later iterations would not see it). "
    )


class InputRefit(Refusal):
    """A ``fit`` (or ``set_params``) of an estimator from before the loop."""

    KIND = "input-refit"


class Break(Refusal):
    KIND = "break"
    MESSAGE = (
        "`break` stops the loop at an iteration that depends on the "
        "iterations before it, but engines run iterations independently "
        "and all at once. "
    )
    ADVICE = (
        "Record a flag per iteration (e.g. "
        "`hits.append(i)`) and pick the first one after the loop, or run "
        "the cell serially."
    )


class Return(Refusal):
    KIND = "return"
    MESSAGE = (
        "`return` is not allowed in the loop: the cell is not a function, and "
        "leaving the loop early makes the result depend on iteration order. "
    )
    ADVICE = "Use `continue` to skip the rest of an iteration."


class Yield(Refusal):
    KIND = "yield"
    MESSAGE = "`yield` is not allowed in the loop: the cell is not a generator. "
    ADVICE = "Collect the values in a list instead."


class Await(Refusal):
    """``await``, ``async for``/``with`` (``what`` says which), ``fix``."""

    KIND = "await"


class _Rebinding(Refusal):
    MESSAGE = (
        "`{kw} {name}` would rebind `{name}` in an engine's namespace, not in yours. "
    )
    ADVICE = (
        "Assign `{name}` in the loop body (it comes back as the value "
        "of the last iteration) or collect values and combine them after "
        "the loop."
    )

    def __init__(self, line: int, col: int, name: str) -> None:
        super().__init__(line, col, name, kw=self.KIND)


class Global(_Rebinding):
    KIND = "global"


class Nonlocal(_Rebinding):
    KIND = "nonlocal"


class DelOuter(Refusal):
    KIND = "del-outer"
    MESSAGE = (
        "`del {name}` deletes a name that exists before the loop; "
        "an engine can delete only its own copy. "
    )
    ADVICE = "Delete `{name}` after the loop."


class StarImport(Refusal):
    KIND = "star-import"
    MESSAGE = "`from ... import *` in the loop binds names the analysis cannot see. "
    ADVICE = "Import the names you use explicitly."


class MixedUse(Refusal):
    KIND = "mixed-use"
    MESSAGE = (
        "`{name}` is used both as {kinds} in the loop; gpucell can merge "
        "one kind of contribution per name. "
    )


class MixedReduction(Refusal):
    KIND = "mixed-reduction"
    MESSAGE = (
        "`{name}` is combined with different operators or forms "
        "({forms}); a parallel reduction needs one associative operator per name. "
    )
    ADVICE = "Use one form (e.g. only `{name}{key} += ...`).{depth_fix}"


class LoopTarget(Refusal):
    KIND = "loop-target"
    MESSAGE = (
        "the loop assigns each item to `{name}`, which changes "
        "an object outside the iteration. "
    )
    ADVICE = (
        "Use plain names as loop targets "
        "(`for i, x in ...`) and store the values in the body."
    )


class IterableMutated(Refusal):
    """The loop's iterable (``iterated``, its source text) reads ``name``
    lazily, and the body changes ``name``; ``read_at``: a line that also reads
    it, which a copy of the iterable would not help."""

    KIND = "iterable-mutated"
    MESSAGE = (
        "the loop iterates over `{iterated}`{made_from}, which the body also "
        "changes (line {changed_at}); serially the loop could see its own changes. "
    )
    ADVICE = "{fix}"

    def __init__(
        self,
        line: int,
        col: int,
        name: str,
        *,
        iterated: str,
        changed_at: int,
        read_at: int | None,
    ) -> None:
        made_from = "" if iterated == name else f", made from `{name}`"
        if read_at is not None:
            fix = (
                f"A copy (`list({iterated})`) is not enough here: the body "
                f"also reads `{name}` (see line {read_at})."
            )
        else:
            fix = (
                f"Iterate over a copy (`for x in list({iterated}):`) "
                "or collect into another name."
            )
        super().__init__(
            line,
            col,
            name,
            iterated=iterated,
            made_from=made_from,
            changed_at=str(changed_at),
            fix=fix,
        )


class WithTarget(Refusal):
    KIND = "with-target"
    MESSAGE = (
        "the loop reads `{name}`, which a `with ... as {name}` around it opened in "
        "the kernel; an engine cannot use that object (a file, a connection "
        "or a lock does not travel). "
    )
    ADVICE = (
        "Read what you need from it before the "
        "loop (`data = {name}.read()`, or loop over `{name}` itself: the loop's "
        "items are read in the kernel), or run the cell without "
        "%%gpu_parallel."
    )


class ShortCircuitWalrus(Refusal):
    KIND = "short-circuit-walrus"
    MESSAGE = (
        "`{name}` is assigned inside `{call}(...)`, which "
        "stops at its deciding item; in parallel every item runs, "
        "so `{name}` would hold a later item's value. "
    )
    ADVICE = (
        "Assign it in "
        "a `for` loop, or compute the items first (`vals = [...]`, "
        "then `{call}(vals)`)."
    )


class NoLoop(Refusal):
    KIND = "no-loop"
    MESSAGE = (
        "the cell has no top-level `for` loop and no top-level "
        "`name = [... for ...]` list comprehension to run in parallel. "
    )
    ADVICE = (
        "Put the "
        "loop at the top level of the cell or of `with` blocks (not inside "
        "`if`, `try` or a function), or run the cell without %%gpu_parallel."
    )

    def __init__(self) -> None:
        super().__init__(1, 0, "")


class WhileLoop(Refusal):
    """A top-level ``while``: its iterations are not known until they run."""

    KIND = "while-loop"
    MESSAGE = (
        "the loop is a `while` loop: %%gpu_parallel splits a `for` loop's items "
        "among the engines, and a `while` loop's iterations cannot be known in "
        "advance (each one runs only if the condition, after the iterations "
        "before it, still holds). "
    )
    ADVICE = (
        "If the iterations are independent, rewrite it as a `for` over the "
        "items (`for x in items:`, `for i in range(n):`); a loop that runs until "
        "a condition holds (convergence, a search) runs as written without "
        "%%gpu_parallel."
    )

    def __init__(self, line: int, col: int) -> None:
        super().__init__(line, col, "")


class UndefinedInput(Refusal):
    """A warning: an input neither the namespace nor the prelude defines."""

    KIND = "undefined-input"
    MESSAGE = "`{name}` is read in the loop but is not defined before it; "
    ADVICE = "the loop will raise NameError unless the prelude defines it."


def class_name(kind: str) -> str:
    """The class a kind's refusals are instances of: ``loop-carried`` ->
    ``LoopCarried``."""
    return "".join(part.capitalize() for part in kind.split("-"))


#: kind -> its class, for every refusal the analysis makes
REFUSALS: dict[str, type[Refusal]] = {
    cls.KIND: cls
    for cls in (
        LoopCarried,
        SinkRead,
        OuterMutation,
        InputRefit,
        Break,
        Return,
        Yield,
        Await,
        Global,
        Nonlocal,
        DelOuter,
        StarImport,
        MixedUse,
        MixedReduction,
        LoopTarget,
        IterableMutated,
        WithTarget,
        ShortCircuitWalrus,
        NoLoop,
        WhileLoop,
        UndefinedInput,
    )
}
