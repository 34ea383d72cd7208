"""The IPython side: what runs in the user's kernel during a cell.

Thin magics (:mod:`.magics`, :mod:`.parallel_magic`), one cell end to end
(:mod:`.execute`), the only code that talks to engines during a cell
(:mod:`.dispatch`), loops too cheap to send (:mod:`.inline`) and kernel-side
telemetry (:mod:`.telemetry`).
"""
