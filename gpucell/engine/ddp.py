"""``gpucell.ddp`` and ``gpucell.shard``: the one line a single-GPU training cell
changes to train on every rank of a ``%%gpu_distributed`` cell.

Both look at whether a ``torch.distributed`` process group is initialised in
this process (a ``%%gpu_distributed`` cell's, or ``torchrun``'s): without one
(the kernel, a plain ``%%gpu_parallel`` engine) they hand back what they were
given (the model moved to :func:`gpucell.device`), so the same cell text runs
serially in the kernel and across the ranks::

    model = gpucell.ddp(Net())                 # was: model = Net().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for xb, yb in gpucell.shard(loader):   # was: for xb, yb in loader:
            ...

``shard(loader)`` gives each rank ``batch_size / world`` items of every batch
the single process would see (rank ``r`` takes items ``r, r + world, ...`` of
it), and DistributedDataParallel averages the gradients over the ranks, so a
step on the ranks is the single process's step on the whole batch (to float
rounding).  Runs wherever the user's code runs: engines and the kernel.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ddp", "in_group", "shard"]

#: DistributedDataParallel's keyword arguments gpucell.ddp was given, kept on
#: the wrapper so a group re-formed after a failure can wrap the module again
DDP_KWARGS = "_gpucell_ddp_kwargs"


def in_group() -> bool:
    """Whether a torch.distributed process group is initialised here."""
    import sys

    if "torch" not in sys.modules:
        return False
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized())


def ddp(model: Any, **kwargs: Any) -> Any:
    """``model`` on this process's device (:func:`gpucell.device`), wrapped in
    ``DistributedDataParallel`` when a process group is initialised.

    ``kwargs`` go to ``DistributedDataParallel`` (``find_unused_parameters=True``,
    ``broadcast_buffers=False``, ...).  Wrapping broadcasts rank 0's parameters
    and buffers, so every rank starts from the same model.  A model already
    wrapped on the current group is returned as it is; one wrapped on a group
    that was re-formed since is wrapped again (its ``.module``).  Without a
    group (serially, in the kernel) only the move to the device happens, so the
    same cell runs both ways.
    """
    import torch

    from gpucell.engine.runtime import device

    parallel = torch.nn.parallel.DistributedDataParallel
    if isinstance(model, parallel):
        if in_group() and model.process_group is _world():
            return model
        kwargs = {**getattr(model, DDP_KWARGS, {}), **kwargs}
        model = model.module
    dev = device()
    model = model.to(dev)
    if not in_group():
        return model
    ids = [dev.index or 0] if dev.type == "cuda" else None
    wrapped = parallel(model, device_ids=ids, **kwargs)
    setattr(wrapped, DDP_KWARGS, dict(kwargs))
    return wrapped


def _world() -> Any:
    import torch.distributed as dist

    return dist.group.WORLD


def shard(data: Any, *, shuffle: bool | None = None, seed: int = 0) -> Any:
    """This rank's part of ``data`` (``data`` itself without a process group).

    * a ``DataLoader`` of batch size ``B``: a loader over the same dataset with
      batch size ``B / world`` and a ``DistributedSampler``, so the ranks'
      ``k``-th batches together are the single process's ``k``-th batch
      (``shuffle`` defaults to the loader's own; shuffled loaders draw a new
      order each epoch, seeded by ``seed``, the same on every rank).  ``B`` must
      be a multiple of the number of ranks;
    * a tensor, array, list or tuple: items ``rank, rank + world, ...``;
    * any other map-style dataset (``__getitem__`` and ``__len__``): a
      ``Subset`` of those items.
    """
    if not in_group():
        return data
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, RandomSampler, Subset

    world, rank = dist.get_world_size(), dist.get_rank()
    if isinstance(data, DataLoader):
        bs = data.batch_size
        if bs is None:
            raise ValueError(
                "gpucell.shard: this DataLoader has its own batch_sampler; give "
                "shard the dataset (a Subset per rank) or a loader with batch_size."
            )
        if bs % world:
            raise ValueError(
                f"gpucell.shard: batch_size {bs} is not a multiple of the {world} "
                f"ranks, so the ranks cannot split each batch evenly; use a "
                f"batch size like {bs - bs % world or world}."
            )
        if shuffle is None:
            shuffle = isinstance(data.sampler, RandomSampler)
        sampler = _epoch_sampler_class()(
            data.dataset,
            num_replicas=world,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=data.drop_last,
        )
        extra: dict[str, Any] = {}
        if data.num_workers:
            extra = {
                "prefetch_factor": data.prefetch_factor,
                "persistent_workers": data.persistent_workers,
            }
        return DataLoader(
            data.dataset,
            batch_size=bs // world,
            sampler=sampler,
            num_workers=data.num_workers,
            collate_fn=data.collate_fn,
            pin_memory=data.pin_memory,
            drop_last=data.drop_last,
            timeout=data.timeout,
            worker_init_fn=data.worker_init_fn,
            **extra,
        )
    if isinstance(data, (torch.Tensor, list, tuple)) or type(data).__module__ == (
        "numpy"
    ):
        return data[rank::world]
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return Subset(data, range(rank, len(data), world))
    raise TypeError(
        f"gpucell.shard: cannot split a {type(data).__name__}; give it a "
        "DataLoader, a map-style dataset, a tensor, an array, a list or a tuple."
    )


_SAMPLER: Any = None


def _epoch_sampler_class() -> Any:
    """The sampler class, made on first use (importing this module must not
    import torch: ``gpucell.ddp`` is one of gpucell's lazy names)."""
    global _SAMPLER
    if _SAMPLER is not None:
        return _SAMPLER
    from torch.utils.data.distributed import DistributedSampler

    class _EpochSampler(DistributedSampler):  # type: ignore[misc,type-arg]
        """A DistributedSampler that moves to the next epoch by itself each time
        it is iterated (a shuffled single-process loader draws a new order every
        epoch; a plain DistributedSampler repeats the first one unless
        ``set_epoch`` is called).  A ``set_epoch`` call still wins."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._next_epoch = 0
            self._told = False

        def set_epoch(self, epoch: int) -> None:
            super().set_epoch(epoch)
            self._told = True

        def __iter__(self) -> Any:
            if not self._told:
                self.epoch = self._next_epoch
            self._told = False
            self._next_epoch = self.epoch + 1
            return super().__iter__()

    _SAMPLER = _EpochSampler
    return _SAMPLER
