"""Pure, kernel-side logic: no I/O, no ipyparallel, no namespace writes.

Cell analysis (:mod:`.analysis`: text in, plan or error out), chunk planning
(:mod:`.schedule`), the all-or-nothing merge (:mod:`.merge`), engine planning
(:mod:`.topology`), run state (:mod:`.runstate`), the record of a run
(:mod:`.provenance`) and its picture (:mod:`.timeline`).  Strict mypy; imports
only :mod:`gpucell.protocol` and :mod:`gpucell.errors`.
"""
