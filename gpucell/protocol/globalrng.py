"""The process-wide random generators as objects: numpy's global
``RandomState`` (every ``np.random`` function draws from it, and so does a
``rand`` bound before the loop: ``from numpy.random import rand``) and
``random``'s hidden ``Random`` instance.

They are process state, like a module: a bound ``rand`` travels as a
reference to the receiver's own generator (pickled, it would be a copy with
the kernel's state, which neither ``--seed`` reseeds nor the engines watch)
and, as an input, is compared by identity (drawing from it is a draw, warned
or seeded as ``np.random.rand()`` is, not a change to the input).  Standard
library only: numpy is looked up, never imported.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["global_generator", "the_global_generator"]


def global_generator(obj: Any) -> str | None:
    """``"numpy"`` or ``"random"`` when ``obj`` is that process-wide generator
    (or a method bound to it); else ``None``."""
    obj = getattr(obj, "__self__", obj) if type(obj).__name__ == "method" else obj
    name = type(obj).__name__
    if name == "RandomState":
        np = sys.modules.get("numpy")
        mtrand = getattr(getattr(np, "random", None), "mtrand", None)
        if obj is getattr(mtrand, "_rand", None):
            return "numpy"
    elif name == "Random":
        rnd = sys.modules.get("random")
        if obj is getattr(rnd, "_inst", None):
            return "random"
    return None


def the_global_generator(name: str) -> Any:
    """This process's own generator ``name`` (``global_generator``'s answer)."""
    if name == "numpy":
        import numpy

        return numpy.random.mtrand._rand
    import random

    return random._inst
