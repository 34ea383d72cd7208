"""What users see of a run: the live progress widget, the device selector and
monitor, and the timeline of the last cell.

Nothing is imported here: ipywidgets loads only when a display is created (see
:mod:`gpucell.ui.progress`), so ``import gpucell`` stays cheap.  Formatting is in
:mod:`gpucell.ui.model`, pure and testable without a kernel.
"""

from __future__ import annotations
