"""Provenance of the real_gloo_* trace folders: a small DDP job on gloo (CPU), profiled by torch.profiler.

Run with torchrun (torch 2.13, CPU), e.g. for real_gloo_repeat (2 ranks, two profiler cycles):

    REPEAT=2 ACTIVE=3 STEPS=10 torchrun --nproc-per-node 2 make_real_gloo_traces.py OUT_DIR

and for real_gloo_ws1 (a one-process job): ACTIVE=3 STEPS=5 torchrun --nproc-per-node 1 ... OUT_DIR.
Rank SLOW (default 1) sleeps 30 ms per step. Traces are written by tensorboard_trace_handler with
use_gzip=True (``{host}_{pid}.{ms}.pt.trace.json.gz``, one file per rank and profiler cycle);
record_shapes and with_stack are off to keep the files small (SHAPES=1 turns them on).
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
out = sys.argv[1]
repeat = int(os.environ.get("REPEAT", "1"))
active = int(os.environ.get("ACTIVE", "3"))
steps = int(os.environ.get("STEPS", "10"))
slow = int(os.environ.get("SLOW", "1"))
shapes = os.environ.get("SHAPES", "0") == "1"
model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with profile(
    activities=[ProfilerActivity.CPU],
    schedule=schedule(wait=1, warmup=1, active=active, repeat=repeat),
    on_trace_ready=tensorboard_trace_handler(out, use_gzip=True),
    record_shapes=shapes,
    with_stack=shapes,
) as prof:
    for _ in range(steps):
        x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
        if rank == slow:
            time.sleep(0.03)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.step()
dist.destroy_process_group()
