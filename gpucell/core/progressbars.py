"""Progress bars from before the loop (``bar = tqdm(total=n)``), driven by the
body (``bar.update(1)``, ``bar.set_postfix(loss=...)``).

Such a bar cannot travel to the engines (it holds the notebook's output
stream) and the body never reads it back: what the serial cell leaves is the
bar after each call made in iteration order, which is what the kernel makes
at the merge, on the bar itself.  A bar's calls only draw: no copy is tried
first (a copy of a bar draws a bar of its own).  Pure.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DRAWING_METHODS", "PROGRESS_METHODS", "is_progress_bar"]

#: a bar's methods a loop's body drives it with
PROGRESS_METHODS = frozenset(
    {
        "update", "set_postfix", "set_postfix_str", "set_description",
        "set_description_str", "refresh",
    }
)  # fmt: skip


#: those no container has, which only draw: called on the bar the loop
#: iterates too (``for x in pbar: pbar.set_postfix(...)``)
DRAWING_METHODS = frozenset(
    {"set_postfix", "set_postfix_str", "set_description", "set_description_str"}
)


def is_progress_bar(obj: Any) -> bool:
    """A tqdm bar (``tqdm.auto``, ``tqdm.notebook``, ``trange`` too), known by
    its class's ancestry, without importing tqdm."""
    return any(
        k.__name__ == "tqdm" and k.__module__.split(".")[0] == "tqdm"
        for k in type(obj).__mro__
    )
