"""Code that runs in engine processes only.

The chunk runner (:mod:`.chunk`), the entry points the kernel applies
(:mod:`.worker`), runtime facts and device pinning (:mod:`.runtime`),
asynchronous GPU-to-host copies (:mod:`.tohost`), ipykernel tuning
(:mod:`.tuning`) and engine-side telemetry (:mod:`.telemetry`).

Imports only :mod:`gpucell.protocol`, :mod:`gpucell.devices` and
:mod:`gpucell.errors` (never core, kernel, cluster or ui), so an engine's first
chunk loads a handful of modules and no analysis, traitlets or widgets.
"""
