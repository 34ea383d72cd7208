"""This host's devices, measured where the code runs (the kernel or an engine).

NVML behind the one interface tests replace (:mod:`.nvml`), discovery of GPUs
with a CPU fallback (:mod:`.discovery`), and sampling of engine processes and
their GPUs (:mod:`.sampling`).  Imports only :mod:`gpucell.protocol` and
:mod:`gpucell.errors`, so engines can use it.
"""
