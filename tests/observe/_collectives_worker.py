"""One rank of the 4-rank gloo job of test_collectives_wrap.py (launched as a plain subprocess).

Two data-parallel subgroups, {0, 2} and {1, 3}, as in a TP × DP layout. In each, the rank with the
lower number is the *early* member, the other one the *late* member. Sessions, in one process group:

P. positional arguments: per step two ``dist.all_reduce(t, dist.ReduceOp.SUM, sub)``, one
   ``dist.barrier(sub)``, then ``dist.all_reduce(t, dist.ReduceOp.SUM, sub, True)`` (group and
   async_op positional, as FSDP1 passes its group); the late member sleeps LATE_MS before that one,
   the early member waits on the work at once — it is blocked about LATE_MS per step.
W. async with host work: the early member issues ``dist.all_reduce(t, group=sub, async_op=True)``,
   does HOST_MS of host work, then ``work.wait()``; the late member sleeps LATE_MS, then issues and
   waits. The early member's host work is compute; only the rest until completion is wait.
M. two observers, both ``wrap_collectives=True`` (window 4: their own gathers run): 8 steps under
   both, then A — opened first — closes, and B records 8 more steps alone; then a third, C, records 4
   steps after both closed. torch.distributed's functions and ``Work.wait`` must be the originals
   again once no observer is open.

Each rank writes what it saw to OUT/rank-R.json; the test reads it and the run directories.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import fabricpace
from fabricpace.observe import ObserverConfig
from fabricpace.observe.collectives import WRAPPED

STEPS = 12
LATE_MS = 40
HOST_MS = 20
CFG = ObserverConfig(flush_mode="main", status_line=False, window=4)


def originals() -> dict[str, object]:
    found = {op: getattr(dist, op) for op in WRAPPED if hasattr(dist, op)}
    found["Work.wait"] = dist.Work.wait
    return found


def same(before: dict[str, object]) -> bool:
    return all(fn is before[op] for op, fn in originals().items())


def session_p(rank: int, sub: object, late: bool, out: Path) -> None:
    t = torch.ones(64)
    with fabricpace.observe(None, out / "p", wrap_collectives=True, config=CFG) as obs:
        for _ in range(STEPS):
            with obs.step(samples=4):
                dist.all_reduce(t, dist.ReduceOp.SUM, sub)
                dist.all_reduce(t, dist.ReduceOp.SUM, sub)
                dist.barrier(sub)
                if late:
                    time.sleep(LATE_MS / 1e3)
                dist.all_reduce(t, dist.ReduceOp.SUM, sub, True).wait()
                t.fill_(1.0)


def session_w(rank: int, sub: object, late: bool, out: Path) -> None:
    t = torch.ones(64)
    with fabricpace.observe(None, out / "w", wrap_collectives=True, config=CFG) as obs:
        for _ in range(STEPS):
            with obs.step(samples=4):
                if late:
                    time.sleep(LATE_MS / 1e3)
                    dist.all_reduce(t, group=sub, async_op=True).wait()
                else:
                    work = dist.all_reduce(t, group=sub, async_op=True)
                    time.sleep(HOST_MS / 1e3)  # host work while the all-reduce is in flight
                    work.wait()
                t.fill_(1.0)


def session_m(rank: int, out: Path, result: dict) -> None:
    before = originals()
    t = torch.ones(4)
    a = fabricpace.observe(None, out / "mA", wrap_collectives=True, config=CFG)
    b = fabricpace.observe(None, out / "mB", wrap_collectives=True, config=CFG)
    for _ in range(8):
        with a.step(samples=4), b.step(samples=4):
            dist.all_reduce(t)
    a.close()  # the first opened closes first
    result["after_a"] = same(before)  # B is open: its wrappers stay
    for _ in range(8):
        with b.step(samples=4):
            dist.all_reduce(t)
    b.close()
    result["after_ab"] = same(before)
    with fabricpace.observe(None, out / "mC", wrap_collectives=True, config=CFG) as c:
        for _ in range(4):
            with c.step(samples=4):
                dist.all_reduce(t)
    result["after_c"] = same(before)
    result["failures"] = [a.failures, b.failures, c.failures]


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    subs = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    sub = subs[rank % 2]
    late = rank >= 2
    from fabricpace.observe.collectives import group_name

    result: dict = {"rank": rank, "group": group_name(sub), "late": late}
    session_p(rank, sub, late, out)
    session_w(rank, sub, late, out)
    session_m(rank, out, result)
    (out / f"rank-{rank}.json").write_text(json.dumps(result, default=str))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()
    # Results are written and flushed; skip interpreter teardown (see _gloo_worker.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
