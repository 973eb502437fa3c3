"""``BalancedSampler``: a batch sampler that gives each rank its paced share of every global batch.

Step k's global batch is the same set of samples on every run — positions ``k*B .. (k+1)*B`` of the
epoch's order — and rank r takes a contiguous slice of it whose length comes from the pacer's shares
(equal split when pacing is off or undecided). Multiply each rank's *mean* loss by
``fabricpace.pacing.sample_weight(len(batch), B, world)`` so DDP's averaged gradient equals the mean
over the global batch: the update is then the unbalanced one up to float rounding. (``sampler.weight``
is that weight for the batch the sampler yielded last, which is the batch in hand only with
``num_workers=0``: a DataLoader with workers draws batches ahead, and around a change of shares its
``weight`` belongs to a later batch.)

Works without torch (pass it as ``DataLoader(ds, batch_sampler=...)``; any iterable with ``__len__``
is accepted there). Shares change ``share_lag_steps`` steps after a decision (4 by default), so keep
``num_workers * prefetch_factor`` at or below that lag.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import numpy as np

from fabricpace.pacing.rebalance import counts_from_shares, offsets_from_counts, sample_weight


def _dist_default() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return 0, 1


def find_batch_counts(source: Any) -> Any:
    """``batch_counts`` of a pacer, or of the pacer inside an Observer (through ``.pacer`` links);
    None when there is none (pacing off, or the observer dropped its pacer)."""
    for _ in range(4):
        if source is None:
            return None
        fn = getattr(source, "batch_counts", None)
        if fn is not None:
            return fn
        source = getattr(source, "pacer", None)
    return None


class BalancedSampler:
    """Yields this rank's indices for each step; ``len`` is the number of steps per epoch."""

    def __init__(
        self,
        data: Sized | int,
        global_batch: int,
        *,
        pacing: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        start_step: int = 0,
    ) -> None:
        self.n = int(data) if isinstance(data, int) else len(data)
        d_rank, d_world = _dist_default()
        self.rank = d_rank if rank is None else int(rank)
        self.world_size = d_world if world_size is None else int(world_size)
        if global_batch < self.world_size or global_batch > self.n:
            raise ValueError(
                f"global_batch {global_batch} must lie between world size {self.world_size} and dataset "
                f"size {self.n}"
            )
        self.global_batch = int(global_batch)
        self.pacing = pacing
        self.shuffle, self.seed = shuffle, int(seed)
        self.epoch = 0
        self.step = int(start_step)
        self.weight = 1.0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.n // self.global_batch

    def counts(self, step: int) -> list[int]:
        """Samples per rank at ``step``, from the pacer if one is attached (equal split otherwise)."""
        fn = find_batch_counts(self.pacing)
        if fn is not None:
            return list(fn(self.global_batch, step))
        return counts_from_shares(None, self.global_batch, self.world_size)

    def __iter__(self) -> Iterator[list[int]]:
        if self.shuffle:
            order = np.random.default_rng((self.seed, self.epoch)).permutation(self.n)
        else:
            order = np.arange(self.n)
        b = self.global_batch
        for i in range(len(self)):
            counts = self.counts(self.step)
            start = i * b + offsets_from_counts(counts)[self.rank]
            batch = order[start : start + counts[self.rank]]
            self.weight = sample_weight(len(batch), b, self.world_size)
            self.step += 1
            yield [int(v) for v in batch]
