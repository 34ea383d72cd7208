"""The kernel <-> engine contract, imported on both sides.

What travels and how it is read: the chunk program's names and recorder methods
(:mod:`.program`), chunk objects and chunk results (:mod:`.chunks`), reduction
folding (:mod:`.fold`), serialisation (:mod:`.wire`), shared-memory buffers
(:mod:`.shm`), fingerprints of inputs (:mod:`.fingerprint`), device descriptions
(:mod:`.devices`) and telemetry samples (:mod:`.telemetry`).

Imports only the standard library (plus cloudpickle) and :mod:`gpucell.errors`:
with :mod:`gpucell.engine` and :mod:`gpucell.devices`, this is what a remote
engine's host needs of gpucell.
"""
