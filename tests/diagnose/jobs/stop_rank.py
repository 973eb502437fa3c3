"""A small real DDP job (gloo, CPU) under the fabricpace observer in which one rank is stopped by a real
SIGSTOP for a few seconds at one step, then continued by SIGCONT — the way a preempted, swapped or
debugger-stopped process freezes. The stopped rank cannot continue itself: before stopping, it starts a
shell that sends it SIGCONT after ``--stop-s`` seconds, so the stop lands at a known step.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/diagnose/jobs/stop_rank.py \\
        --run-dir RUN --steps 300 --stop-rank 1 --stop-step 150 --stop-s 3
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", required=True)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--stop-rank", type=int, default=1)
    p.add_argument("--stop-step", type=int, default=150)
    p.add_argument("--stop-s", type=float, default=3.0)
    args = p.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import fabricpace

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(100 + rank)
    with fabricpace.observe(model, run_dir=args.run_dir) as obs:
        for step in range(args.steps):
            with obs.step(samples=8):
                x = torch.randn(8, 32, generator=gen)
                y = torch.randint(0, 4, (8,), generator=gen)
                if rank == args.stop_rank and step == args.stop_step:
                    subprocess.Popen(["sh", "-c", f"sleep {args.stop_s}; kill -CONT {os.getpid()}"])
                    os.kill(os.getpid(), signal.SIGSTOP)  # frozen here until the shell's SIGCONT
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)
