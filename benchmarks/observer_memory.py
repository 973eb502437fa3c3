"""Benchmark: how rank 0's Python memory grows with the steps of an observed job, and where.

A real gloo DDP job (a tiny linear model, so steps are short and many) runs ``--steps`` steps under
``fabricpace.observe``; rank 0 traces its Python allocations with ``tracemalloc`` and compares a
snapshot taken after ``--from`` steps (start-up and first parts done) with one at the end. It prints
the growth per step and the allocation sites that grew most (by traceback), so a change in what the
observer keeps per step or per window shows up as a number and a file:line.

    .venv/bin/python benchmarks/observer_memory.py [--world 2] [--steps 45000] [--from 5000]
        [--pacing auto] [--window 50] [--top 6]

Only Python allocations are traced (``tracemalloc``): allocator fragmentation and native buffers
(gloo, torch) are not in the figure; read RSS for those. Growth that is bounded by design — rank 0's
window rows waiting for their first part (``observe/window_log.py``: a part per 65,536 rows) — shows
up here as per-step growth on runs shorter than that bound.
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import sys
import tempfile
import tracemalloc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, args: argparse.Namespace, port: int, run_dir: str) -> None:
    import torch
    import torch.distributed as dist

    import fabricpace
    from fabricpace.observe import ObserverConfig

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(args.world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(args.world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8)
    obs = fabricpace.observe(model, run_dir, window=args.window, pacing=args.pacing,
                             config=ObserverConfig(status_line=False))
    if rank == 0:
        tracemalloc.start(12)
    first = None
    for i in range(args.steps):
        with obs.step(samples=4):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        if rank == 0 and i + 1 == args.start:
            gc.collect()
            first = (tracemalloc.take_snapshot(), tracemalloc.get_traced_memory()[0])
    if rank == 0 and first is not None:
        gc.collect()
        last, traced = tracemalloc.take_snapshot(), tracemalloc.get_traced_memory()[0]
        n = args.steps - args.start
        print(f"observer memory, {args.world} gloo ranks, pacing={args.pacing!r}, window {args.window}: "
              f"rank 0's traced Python allocations grew {traced - first[1]:+,} B over steps "
              f"{args.start:,}..{args.steps:,} = {(traced - first[1]) / n:+.2f} B/step")
        print(f"top {args.top} sites by growth (size, blocks, innermost frames):")
        for stat in last.compare_to(first[0], "traceback")[: args.top]:
            per_step = stat.size_diff / n
            print(f"  {stat.size_diff:+,} B in {stat.count_diff:+,} blocks = {per_step:+.2f} B/step")
            for line in stat.traceback.format()[-4:]:
                print(f"      {line.strip()}")
        sys.stdout.flush()
    obs.close()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=45_000)
    ap.add_argument("--from", dest="start", type=int, default=5_000,
                    help="first snapshot after this many steps")
    ap.add_argument("--pacing", default="auto")
    ap.add_argument("--window", type=int, default=50)
    ap.add_argument("--top", type=int, default=6)
    args = ap.parse_args()
    if not 0 < args.start < args.steps:
        ap.error("--from must be between 0 and --steps")
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="fp-memory-") as tmp:
        mp.spawn(_rank, args=(args, _free_port(), os.path.join(tmp, "run")), nprocs=args.world)


if __name__ == "__main__":
    main()
