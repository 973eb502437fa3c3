"""Provenance of data/gloo_buckets*: a 4-rank DDP job on gloo (CPU) with three buckets a step, profiled.

Run with torchrun (torch 2.13, CPU, on a 2-core host), two runs a minute apart:

    torchrun --standalone --nproc-per-node 4 make_gloo_buckets_traces.py gloo_buckets
    STALL=-1 torchrun --standalone --nproc-per-node 4 make_gloo_buckets_traces.py gloo_buckets_straggler

A 4-layer MLP under DDP with bucket_cap_mb=0.5 gives three gradient buckets a step (1,071,144,
1,050,624 and 526,336 bytes); gloo's two worker threads take the first two at once, the third waits in
the queue until one of them is free, so its ``gloo:all_reduce`` span starts long after the issuing
``c10d::allreduce_``. Rank SLOW (default 2) sleeps 30 ms before forward (a straggler); rank STALL
(default 1) reads its batch from a ``DataLoader`` whose ``__getitem__`` sleeps 20 ms (time the profiler
records as ``enumerate(DataLoader)#...``). schedule(wait=1, warmup=1, active=8): steps 2-9, one file per
rank written by tensorboard_trace_handler(worker_name=rank{r}, use_gzip=True); record_shapes on (the
bucket sizes), with_stack off (small files).
"""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
out = sys.argv[1]
slow = int(os.environ.get("SLOW", "2"))
stall = int(os.environ.get("STALL", "1"))
net = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                    nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
model = DDP(net, bucket_cap_mb=0.5)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(rank)
batches = [(torch.randn(32, 256, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(4)]


class Data(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 1000

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        if rank == stall:
            time.sleep(0.020)
        return batches[i % len(batches)]


loader = iter(torch.utils.data.DataLoader(Data(), batch_size=None, num_workers=0))
with profile(
    activities=[ProfilerActivity.CPU],
    schedule=schedule(wait=1, warmup=1, active=8, repeat=1),
    on_trace_ready=tensorboard_trace_handler(out, worker_name=f"rank{rank}", use_gzip=True),
    record_shapes=True,
) as prof:
    for _ in range(10):
        x, y = next(loader)
        if rank == slow:
            time.sleep(0.030)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.step()
dist.barrier()
dist.destroy_process_group()
