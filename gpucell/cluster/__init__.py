"""Cluster lifecycle in the kernel, and the launch hooks ipyparallel runs.

:mod:`.lifecycle` starts, connects to and stops clusters through ipyparallel's
``Cluster`` and ``Client``; :mod:`.launcher` is the launch hook registered under
the ``ipyparallel.engine_launchers`` entry point; :mod:`.boot` starts each
engine and controller process (standard library only); :mod:`.shm_channel` is
the kernel's shared-memory channel.  Nothing is imported here: ``python -m
gpucell.cluster.boot`` must load nothing but the standard library first.
"""
