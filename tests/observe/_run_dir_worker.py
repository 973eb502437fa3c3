"""One rank of a small job that only records steps: which run directory did it write?

    _run_dir_worker.py dist|nodist CWD RUN_DIR OUT_JSON

``dist``: a gloo process group (env://), so the ranks agree on the directory; ``nodist``: none (each
rank chooses alone, as when ``observe()`` is called before ``init_process_group``). The rank works in
CWD, which the test makes per-rank to stand for one node's own disk.
"""

from __future__ import annotations

import json
import os
import sys
import time

import fabricpace
from fabricpace.observe import ObserverConfig


def main() -> None:
    mode, cwd, run_dir, out = sys.argv[1:5]
    os.chdir(cwd)
    if mode == "dist":
        import torch.distributed as dist

        dist.init_process_group("gloo")
    cfg = ObserverConfig(status_line=False, window=5, flush_every=5, flush_interval_s=0)
    with fabricpace.observe(None, run_dir, config=cfg) as obs:
        for _ in range(12):
            with obs.step(samples=4):
                time.sleep(0.001)
    with open(out, "w") as f:
        json.dump({"run_dir": str(obs.run_dir), "failures": obs.failures}, f)
    if mode == "dist":
        dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # (torch's gloo teardown can abort a finished rank, see _gloo_worker)


if __name__ == "__main__":
    main()
