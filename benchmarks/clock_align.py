"""Benchmark: clock alignment as the number of clocks grows (real processes, a real TCPStore).

Every process runs the observer's exchange (``fabricpace.observe.align.ClockSync``) against rank 0
over one TCPStore, as in a job. All processes here share one kernel clock, so every true offset is 0:
the printed |offset| is the estimate's error, and ``err`` the bound the observer reports
(``ranks.clock_err_ns``). ``--own-clocks`` (default) gives each rank a clock domain of its own, as if
each rank were a host: the worst case, one exchange per rank. ``--shared`` lets the ranks find that
they share a clock (the observer's default): one exchange per host, here none.

    .venv/bin/python benchmarks/clock_align.py --worlds 8,16,32 [--rounds 12] [--shared]

On 2 cores, 32 processes also compete for the CPU: widths include scheduling delays. What to read
is how err and |offset| change with the world size.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, os, sys, time
from datetime import timedelta
import torch.distributed as dist
from fabricpace.observe.align import ClockSync, clock_domain
from fabricpace.observe.sidechannel import SideChannel
rank, world, port, rounds, shared = (int(v) for v in sys.argv[1:6])
store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timedelta(seconds=300))
ch = SideChannel(store, "bench", 300)
ch.set(f"ready/{rank}", "1")
for r in range(world):
    ch.wait(f"ready/{r}")
domain = clock_domain() if shared else f"rank-{rank}"
t0 = time.perf_counter()
sync = ClockSync(ch, rank=rank, world=world, now=time.perf_counter_ns, rounds=rounds, domain=domain)
est = sync.exchange(0)
took = time.perf_counter() - t0
print(json.dumps({"rank": rank, "err_us": est.err_ns / 1e3, "offset_us": est.offset_ns / 1e3, "s": took}))
ch.set(f"done/{rank}", "1")
if rank == 0:
    for r in range(world):
        ch.wait(f"done/{r}")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(world: int, rounds: int, shared: bool) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="fp-clock-") as tmp:
        script = Path(tmp) / "child.py"
        script.write_text(CHILD)
        port = free_port()
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), str(r), str(world), str(port), str(rounds), str(int(shared))],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            )
            for r in range(world)
        ]
        rows = []
        for p in procs:
            out, err = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"a rank failed:\n{err[-2000:]}")
            rows.append(json.loads(out.strip().splitlines()[-1]))
    return sorted(rows, key=lambda r: r["rank"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", default="8,16,32")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--shared", action="store_true", help="ranks discover their shared clock")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; rounds {args.rounds}; "
          f"{'shared clock domain' if args.shared else 'one clock domain per rank'}")
    print(f"{'ranks':>5} {'err median':>11} {'err max':>9} {'|offset| median':>16} {'|offset| max':>13} "
          f"{'exchange s':>11}")
    for world in (int(w) for w in args.worlds.split(",")):
        t0 = time.perf_counter()
        rows = [r for r in run(world, args.rounds, args.shared) if r["rank"] != 0]
        errs = [r["err_us"] for r in rows]
        offs = [abs(r["offset_us"]) for r in rows]
        print(f"{world:>5} {statistics.median(errs):>9.0f}us {max(errs):>7.0f}us "
              f"{statistics.median(offs):>14.0f}us {max(offs):>11.0f}us {max(r['s'] for r in rows):>11.2f}"
              f"   ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
