"""One rank of a small gloo job whose run directory is removed while it runs.

    _removed_dir_worker.py RUN_DIR STEPS REMOVE_AT

Every step all-reduces a tensor; the observer writes a part every 5 steps. At step REMOVE_AT (after
a barrier, so that both ranks are past the same step) rank 0 removes RUN_DIR, as ``rm -rf`` would;
both ranks go on to STEPS and print ``DONE <steps> <failures>``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import fabricpace
from fabricpace.observe import ObserverConfig


def _remove(run_dir: str) -> None:
    # A writer thread may be putting a part down at this instant (rm -rf then meets a folder that
    # is not empty): retry, as a user would, until the directory is gone.
    for _ in range(200):
        shutil.rmtree(run_dir, ignore_errors=True)
        if not os.path.exists(run_dir):
            return
        time.sleep(0.01)
    raise RuntimeError(f"could not remove {run_dir}")


def main() -> None:
    run_dir, steps, remove_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = ObserverConfig(status_line=False, window=5, flush_every=5, flush_interval_s=0)
    t = torch.ones(64)
    with fabricpace.observe(None, run_dir, config=cfg) as obs:
        for step in range(steps):
            if step == remove_at:
                dist.barrier()
                if rank == 0:
                    _remove(run_dir)
                dist.barrier()
            with obs.step(samples=4):
                time.sleep(0.002)
                dist.all_reduce(t)
    print("DONE", steps, json.dumps(obs.failures), flush=True)
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # (torch's gloo teardown can abort a finished rank)


if __name__ == "__main__":
    main()
