"""A warning an iteration showed on an engine, as it travels to the kernel.

Serially ``warnings.warn`` in the loop goes through the kernel's warnings
machinery: shown once per place (the module's registry), caught by a
``catch_warnings(record=True)`` or turned into a ``py.warnings`` log record by
``logging.captureWarnings``.  An engine printing its own copy showed each one
once per engine and chunk, and none of those reached the kernel.  So the
engines keep what they would show (their filters are the kernel's, so an
``"error"`` filter still raises in the iteration) and the kernel issues each
again, in iteration order, among the loop's log records.

Standard library only: both sides import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Warned"]


@dataclass(frozen=True)
class Warned:
    """``warnings.warn_explicit``'s arguments for one shown warning."""

    message: Any  # the Warning instance, or its text where it does not pickle
    category: type[Warning]
    filename: str
    lineno: int
    module: str  # what filters match (``__name__`` of the code that warned)
