"""Pacing on transient faults: a straggler that ends (or starts and ends) at any step, not only at a window
boundary.

    .venv/bin/python benchmarks/pacing_transient.py                       # the whole grid (~15 min niced)
    .venv/bin/python benchmarks/pacing_transient.py --setup paper --nodes 4 --seeds 3
    .venv/bin/python benchmarks/pacing_transient.py --cache /tmp/t10/base.json   # baselines reused
    .venv/bin/python benchmarks/pacing_transient.py --only paper/r2.0/0-50/300 --verbose

A real fault (a data loader warming its cache, a thermal throttle, another job on the host) ends at any
step; the controller sees the job once per window. The grid crosses

* three set-ups: the paper's cluster and workload (jitter 0.02, as in ``pacing_stress.py
  --targeted``), BERT-large on ``dgx-h100-ib`` and ResNet-50 on ``roce-leaf-spine-2to1`` (jitter 0.03);
* three faults: rank 3 twice as slow, rank 3 1.3x slow, node 1 1.5x slow;
* fault spans from step 0 to an end step from 31 to 171 in uneven strides against the 50-step window
  (and "to the end": a persistent fault, where pacing must keep its gain), and spans that start
  mid-run (step 73) and end at 104 ... 166;
* 300-step runs (warm-up 50) and, on the paper set-up, 100-step runs whose only measured window is the
  one after the first decision;
* on the paper set-up, slowness that wanders: a different node 1.3x slow in each 50-step span (400
  steps), the spans aligned with the windows or shifted by 17 or 33 steps;
* 4 and 8 nodes, ``--seeds`` paired seeds (both arms draw the same noise).

Each run is ``pacing_sim.run``: the same ``simulate`` + ``summarize_run`` and the same controller that
``fabricpace study --backend sim --compare baseline,paced`` runs (in-process). Verdict per row as in
``pacing_sim.py``: "WORSE" when the 95% t-CI of the paired relative throughput change lies below 0.
Baseline runs do not depend on the controller; ``--cache FILE`` stores them, so a before/after
comparison of a controller change re-runs only the paced arm.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pacing_sim as ps

from fabricpace.pacing import PacingConfig
from fabricpace.sim.noise import NoiseSpec

SETUPS: dict[str, tuple[str, str, float]] = {  # name -> (cluster, workload, jitter cv)
    "paper": ("paper", "paper", 0.02),
    "dgx-bert": ("dgx-h100-ib", "bert-large", 0.03),
    "roce-resnet": ("roce-leaf-spine-2to1", "resnet-50", 0.03),
}
FAULTS: dict[str, tuple[str, float]] = {"r2.0": ("rank", 2.0), "r1.3": ("rank", 1.3), "n1.5": ("node", 1.5)}
# End steps in uneven strides against the 50-step window (0 = a fault that never ends).
ENDS = (31, 38, 44, 47, 50, 53, 58, 66, 73, 79, 87, 96, 104, 117, 131, 147, 158, 171, 0)
MIDRUN = (73, (104, 118, 127, 139, 152, 166))  # start step, end steps
SHORT_ENDS = (31, 38, 44, 47, 50, 53, 66, 79, 96, 0)  # 100-step runs
WANDER = "wander1.3"  # slowness that moves from node to node every 50 steps (session 8's class)
WANDER_SHIFTS = (0, 17, 33)  # first step of the first span: aligned with the windows, or not


@dataclass(frozen=True)
class Row:
    setup: str
    fault: str
    start: int
    end: int  # 0: never ends
    steps: int
    nodes: int

    @property
    def key(self) -> str:
        span = f"{self.start}-{self.end or 'end'}"
        return f"{self.setup}/{self.fault}/{span}/{self.steps}/{self.nodes}n"

    def noise(self) -> NoiseSpec:
        jitter = SETUPS[self.setup][2]
        if self.fault == WANDER:  # a different node 1.3x slow in each 50-step span, shifted by `start`
            spans = range(self.start, self.steps, 50)
            slow = [{"node": i % self.nodes, "factor": 1.3, "from_step": a, "to_step": a + 50}
                    for i, a in enumerate(spans)]
            if self.start:
                slow.insert(0, {"node": self.nodes - 1, "factor": 1.3, "to_step": self.start})
            return NoiseSpec.model_validate({"name": self.key, "jitter": {"cv": jitter}, "slow": slow})
        who, factor = FAULTS[self.fault]
        fault: dict[str, Any] = {who: 3 if who == "rank" else 1, "factor": factor}
        if self.start:
            fault["from_step"] = self.start
        if self.end:
            fault["to_step"] = self.end
        return NoiseSpec.model_validate({"name": self.key, "jitter": {"cv": jitter}, "slow": [fault]})


def grid(setups: list[str], nodes: list[int], short: bool) -> list[Row]:
    rows = []
    for s in setups:
        for n in nodes:
            for f in FAULTS:
                rows += [Row(s, f, 0, e, 300, n) for e in ENDS]
                if f != "r1.3":
                    rows += [Row(s, f, MIDRUN[0], e, 300, n) for e in MIDRUN[1]]
                if short and s == "paper" and f != "r1.3":
                    rows += [Row(s, f, 0, e, 100, n) for e in SHORT_ENDS]
            if s == "paper":
                rows += [Row(s, WANDER, shift, 0, 400, n) for shift in WANDER_SHIFTS]
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup", action="append", default=[], choices=list(SETUPS))
    ap.add_argument("--nodes", default="4,8")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-short", action="store_true", help="leave out the 100-step runs")
    ap.add_argument("--only", action="append", default=[], help="row key prefix (repeatable)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="PacingConfig override for the paced arm")
    ap.add_argument("--cache", default="", help="JSON file of baseline runs (read and extended)")
    ap.add_argument("--json", default="", help="write the rows here")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    overrides = {k: float(v) if "." in v else int(v) for k, v in (s.split("=", 1) for s in args.set)}
    config = PacingConfig().with_overrides(**overrides)
    rows = grid(args.setup or list(SETUPS), [int(x) for x in args.nodes.split(",")], not args.no_short)
    if args.only:
        rows = [r for r in rows if any(r.key.startswith(p) for p in args.only)]
    cache: dict[str, list[list[float]]] = {}
    if args.cache and Path(args.cache).exists():
        cache = json.loads(Path(args.cache).read_text())
    seeds = list(range(args.seed, args.seed + args.seeds))
    loaded: dict[str, tuple[Any, Any]] = {}
    out: dict[str, Any] = {}
    worse = better = 0
    losses: list[float] = []
    for i, r in enumerate(rows):
        cname, wname, _ = SETUPS[r.setup]
        if r.setup not in loaded:
            loaded[r.setup] = (ps.load_unseen_cluster(cname), ps.load_unseen_workload(wname))
        cl, wl = loaded[r.setup]
        noise = r.noise()
        kw = {"nodes": r.nodes, "cl": cl, "wl": wl, "steps": r.steps, "warmup": 50}
        ck = f"{r.key}@{args.seed}x{args.seeds}"
        if ck in cache:
            base = [ps.Run(throughput=t, cv=c) for t, c in cache[ck]]
        else:
            base = [ps.run(noise, seed=s, **kw) for s in seeds]
            cache[ck] = [[b.throughput, b.cv] for b in base]
        paced = [ps.run(noise, seed=s, mode="paced", config=config, **kw) for s in seeds]
        p = ps.paired(base, paced)
        worse += p.verdict == "WORSE"
        better += p.verdict == "better"
        if p.verdict == "WORSE":
            losses.append(p.delta_pct)
        out[r.key] = {**asdict(r), **asdict(p), "verdict": p.verdict, "cv_verdict": p.cv_verdict,
                      "decisions": [list(x.decisions) for x in paced]}
        flag = " <<<" if p.verdict == "WORSE" else ""
        print(f"{r.key:34s} {p.line()}{flag}", flush=True)
        if args.verbose:
            for s, x in zip(seeds, paced, strict=True):
                print(f"      seed {s}: {x.throughput:.1f}  {'; '.join(x.decisions)}", flush=True)
        if args.cache and (i % 20 == 19 or i == len(rows) - 1):
            Path(args.cache).write_text(json.dumps(cache))
    mean_loss = sum(losses) / len(losses) if losses else 0.0
    print(f"transient grid: {len(out)} rows, WORSE {worse} (mean {mean_loss:+.2f}%, "
          f"worst {min(losses, default=0.0):+.2f}%), better {better}, n={args.seeds} paired seeds",
          flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
