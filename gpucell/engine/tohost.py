"""GPU results start their way to the host while the next iteration computes.

A chunk's results must reach the kernel as CPU tensors.  Copying each one with
``.cpu()`` when the chunk ends serialises every copy after all the compute; instead,
each CUDA tensor a gathered or written value holds is copied as soon as the
iteration records it, into pinned host memory on a side stream (``non_blocking``),
so the copy overlaps the next iteration's kernels.  The chunk waits for the side
streams once, at its end.

This is the whole GPU-specific part of the result path; everything else sees CPU
tensors.  It needs a GPU to do anything: without one :func:`copier` returns ``None``
and values are recorded as they are.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["HostCopier", "copier"]


class HostCopier:
    """Copy the CUDA tensors inside a value to pinned host memory, asynchronously.

    ``copier(value)`` returns the value with each CUDA tensor (also inside lists,
    tuples and dicts) replaced by a host tensor whose copy is in flight;
    :meth:`wait` blocks until every copy started so far has landed.
    """

    def __init__(self) -> None:
        self._torch: Any = None  # found once the loop has imported it
        self._streams: dict[Any, Any] = {}
        #: told of each copy as it starts (``sink(host, event)``, the event
        #: recorded after it): the write-behind of the chunk's result file
        self.sink: Any = None

    def __call__(self, value: Any) -> Any:
        torch = self._torch or sys.modules.get("torch")
        if torch is None:
            return value  # no torch imported: no CUDA tensor can exist
        self._torch = torch
        return self._walk(value, torch)

    def _walk(self, value: Any, torch: Any) -> Any:
        t = type(value)
        if t is list:
            return [self._walk(v, torch) for v in value]
        if t is tuple:
            return tuple(self._walk(v, torch) for v in value)
        if t is dict:
            return {k: self._walk(v, torch) for k, v in value.items()}
        if isinstance(value, torch.Tensor) and value.is_cuda:
            return self._copy(value)
        return value

    def _copy(self, value: Any) -> Any:
        torch = self._torch
        if value.layout != torch.strided or value.is_quantized:
            return value  # exotic: wire's synchronous path handles it
        side = self._streams.get(value.device)
        if side is None:
            side = self._streams[value.device] = torch.cuda.Stream(value.device)
        # the copy must see the kernels that produced the value ...
        side.wait_stream(torch.cuda.current_stream(value.device))
        host = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
        with torch.cuda.stream(side):
            host.copy_(value.detach(), non_blocking=True)
        # ... and the caching allocator must not hand the value's memory to the
        # next iteration before the side stream has read it
        value.record_stream(side)
        if self.sink is not None:
            landed = torch.cuda.Event()
            landed.record(side)
            self.sink(host, landed)
        if value.requires_grad:
            host.requires_grad_(True)
        return host

    def wait(self) -> None:
        for side in self._streams.values():
            side.synchronize()


def copier(device: Any) -> HostCopier | None:
    """A copier for an engine whose device is a GPU, else ``None`` (CPU engines
    record values as they are, with no per-value check)."""
    if device is None or "cuda" not in str(device):
        return None
    return HostCopier()
