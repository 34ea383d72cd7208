"""What one write-back is: the engine's ``Update`` of an iteration's own item,
and the kernel object it goes to (``Target``), named in refusals as the user
would name it.  Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["SELF", "Target", "Update"]


#: (iteration, path into its item, ("module" | "tensor" | "attrs", ...)): the
#: path's ints are a tuple item's parts, its ``("el", j)`` steps the j-th
#: element of a container (in the order the kernel's has before the merge)
Update = tuple[int, tuple[Any, ...], tuple[Any, ...]]


#: the step from a bound method item to its object
SELF = ("self", 0)


@dataclass
class Target:
    """One kernel object and what to write into it."""

    iteration: int
    obj: Any
    update: tuple[Any, ...]
    path: tuple[Any, ...] = ()

    @property
    def label(self) -> str:
        what = f"(a {type(self.obj).__name__})"
        last = self.path[-1] if self.path else None
        if isinstance(last, tuple) and last[0] == "attr":
            return (
                f"the attribute `{self.path[-1][1]}` {what} of the item of "
                f"iteration {self.iteration}"
            )
        if self.path and self.path[-1] == SELF:
            return f"the object of the item of iteration {self.iteration} {what}"
        if any(isinstance(j, tuple) for j in self.path):
            return f"an element {what} of the item of iteration {self.iteration}"
        return f"the item of iteration {self.iteration} {what}"

    def within(self, other: Target) -> bool:
        """Whether this is an element (at any depth) of ``other``'s object,
        written back with it: the one item holds it, as the engine's did."""
        n = len(other.path)
        return (
            self.iteration == other.iteration
            and len(self.path) > n
            and self.path[:n] == other.path
        )
