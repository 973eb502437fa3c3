"""Accuracy matrix of the diagnosis: for every failure mode and for healthy runs, is the mode right and
the culprit right — over several seeds, on synthetic run directories (exact faults) and on simulator
runs (fabricpace.sim). Prints one row per case and the totals. Not a pass/fail test (tests/diagnose is).

    .venv/bin/python benchmarks/diagnose_accuracy.py [--seeds 5] [--out /tmp/fabricpace-acc]
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fabricpace.diagnose import Diagnosis, diagnose
from fabricpace.diagnose.synthetic import SynthSpec, write_synthetic

Check = Callable[[Diagnosis], bool]


def _culprit(mode: str, **want: Any) -> Check:
    def ok(d: Diagnosis) -> bool:
        f = next((f for f in d.findings if f.mode == mode), None)
        return f is not None and all(getattr(f.culprits, k) == v for k, v in want.items())

    return ok


def _period(first: int, last: int) -> Check:
    def ok(d: Diagnosis) -> bool:
        f = next((f for f in d.findings if f.mode == "topology_contention"), None)
        if f is None or not f.evidence.get("periods"):
            return False
        p = f.evidence["periods"][0]
        return abs(p["first_step"] - first) <= 6 and abs(p["last_step"] - last) <= 6

    return ok


def _cross_leaf(d: Diagnosis) -> bool:
    f = next((f for f in d.findings if f.mode == "topology_contention"), None)
    return f is not None and f.evidence.get("cross_leaf_excess_share", 0) >= 0.7 and bool(f.culprits.links)


def _none(d: Diagnosis) -> bool:
    return d.healthy


B = dict(ranks=16, gpus_per_node=4, nodes_per_leaf=2, steps=140)
SYNTH: list[tuple[str, dict[str, Any], set[str], Check]] = [
    ("healthy 1% jitter", {}, set(), _none),
    ("healthy 3% jitter", dict(jitter=0.03), set(), _none),
    ("healthy 2 ranks", dict(ranks=2, gpus_per_node=1), set(), _none),
    ("healthy 64 ranks, pairs", dict(ranks=64, gpus_per_node=8, pair_groups=True, steps=100), set(), _none),
    ("healthy unaligned clocks", dict(clock_err_ns=None, clock_skew_ns=5_000_000), set(), _none),
    (
        "straggler rank +15%",
        dict(slow_ranks=(5,), slow_factor=1.15),
        {"persistent_straggler"},
        _culprit("persistent_straggler", ranks=[5], nodes=[1]),
    ),
    (
        "straggler rank +5%",
        dict(slow_ranks=(5,), slow_factor=1.05),
        {"persistent_straggler"},
        _culprit("persistent_straggler", ranks=[5]),
    ),
    (
        "straggler +3% compute = 2.4% of step (below threshold, no finding expected)",
        dict(slow_ranks=(5,), slow_factor=1.03),
        set(),
        _none,
    ),
    (
        "slow node +10%",
        dict(slow_ranks=(8, 9, 10, 11), slow_factor=1.10),
        {"persistent_straggler"},
        _culprit("persistent_straggler", nodes=[2], ranks=[8, 9, 10, 11]),
    ),
    (
        "straggler, unaligned clocks",
        dict(slow_ranks=(6,), slow_factor=1.15, clock_err_ns=None, clock_skew_ns=5_000_000),
        {"persistent_straggler"},
        _culprit("persistent_straggler", ranks=[6]),
    ),
    (
        "healthy, rank 0 +2% (logging; below threshold)",
        dict(slow_ranks=(0,), slow_factor=1.02),
        set(),
        _none,
    ),
    (
        "hard: straggler +10% under 5% jitter",
        dict(slow_ranks=(9,), slow_factor=1.10, jitter=0.05),
        {"persistent_straggler", "sync_amplification"},
        _culprit("persistent_straggler", ranks=[9]),
    ),
    (
        "intermittent straggler (GC on rank 7 only)",
        dict(gc_ranks=(7,), gc_prob=0.4, gc_ms=20),
        {"persistent_straggler"},
        _culprit("persistent_straggler", ranks=[7]),
    ),
    (
        "rare long pauses on rank 5 (1 step in 10; slowest in ~21% of 8 ranks' steps)",
        dict(ranks=8, steps=400, gc_ranks=(5,), gc_prob=0.1, gc_ms=80, jitter=0.03),
        {"persistent_straggler"},
        _culprit("persistent_straggler", ranks=[5]),
    ),
    (
        "rare long pauses on every rank (1 step in 50; no culprit)",
        dict(steps=400, gc_prob=0.02, gc_ms=200, jitter=0.03),
        {"sync_amplification"},
        _culprit("sync_amplification", ranks=[]),
    ),
    (
        "GC noise",
        dict(gc_prob=0.1, gc_ms=30),
        {"sync_amplification"},
        _culprit("sync_amplification", ranks=[]),
    ),
    ("jitter 8%", dict(jitter=0.08), {"sync_amplification"}, _culprit("sync_amplification", ranks=[])),
    (
        "input stall rank",
        dict(stall_ranks=(3,), stall_ms=15),
        {"input_stall"},
        _culprit("input_stall", ranks=[3]),
    ),
    ("input stall fleet", dict(data_ms=20), {"input_stall"}, _culprit("input_stall", ranks=list(range(16)))),
    ("foreign traffic steps 60-100", dict(foreign=(60, 100, 4.0)), {"topology_contention"}, _period(60, 99)),
    (
        "cross-leaf pairs ×4",
        dict(pair_groups=True, cross_leaf_factor=4.0, ranks=32),
        {"topology_contention"},
        _cross_leaf,
    ),
    (
        "slow stage +30%",
        dict(stages=4, slow_stage=2, stage_factor=1.3),
        {"stage_imbalance"},
        _culprit("stage_imbalance", stages=[2]),
    ),
    (
        "straggler + GC noise",
        dict(slow_ranks=(3,), slow_factor=1.2, gc_prob=0.1, gc_ms=30),
        {"persistent_straggler", "sync_amplification"},
        _culprit("persistent_straggler", ranks=[3]),
    ),
]

SMALL = (
    "name: toy\nparameters: 5.0e7\ngrad_bytes: 4\nbatch_per_gpu: 32\ncompute: {seconds: 0.1}\n"
    "optimizer_seconds: 0.003\n"
)
BIG = SMALL.replace("5.0e7", "1.0e9")
NIC0 = ", ".join(f"node0.nic{i}->switch" for i in range(8))
NIC1 = ", ".join(f"{{link: node1.nic{i}->switch, scale: 0.25}}" for i in range(8))
J = "jitter: {cv: 0.01}\n"
SIM: list[tuple[str, str, str, str | None, set[str], Check]] = [
    ("sim healthy", SMALL, J, None, set(), _none),
    ("sim healthy vs fabric model", BIG, J, "single-switch", set(), _none),
    (
        "sim straggler rank 5 +15%",
        SMALL,
        J + "slow: [{rank: 5, factor: 1.15}]",
        None,
        {"persistent_straggler"},
        _culprit("persistent_straggler", ranks=[5]),
    ),
    (
        "sim slow node 2 +12%",
        SMALL,
        J + "slow: [{node: 2, factor: 1.12}]",
        None,
        {"persistent_straggler"},
        _culprit("persistent_straggler", nodes=[2], ranks=list(range(16, 24))),
    ),
    (  # a straggler of part of the run (diagnose/onset.py): 60 of 144 steps
        "sim slow node 1 +20% from step 100",
        SMALL,
        J + "slow: [{node: 1, factor: 1.2, from_step: 100}]",
        None,
        {"persistent_straggler"},
        _culprit("persistent_straggler", nodes=[1], ranks=list(range(8, 16))),
    ),
    (
        "sim slow node 3 +20% until step 70",
        SMALL,
        J + "slow: [{node: 3, factor: 1.2, to_step: 70}]",
        None,
        {"persistent_straggler"},
        _culprit("persistent_straggler", nodes=[3], ranks=list(range(24, 32))),
    ),
    (
        "sim GC noise",
        SMALL,
        J + "gc: {garbage_mb_per_step: 50, threshold_mb: 500, pause_ms_base: 5, pause_ms_per_mb: 0.06}",
        None,
        {"sync_amplification"},
        _culprit("sync_amplification", ranks=[]),
    ),
    (
        "sim input stall",
        SMALL + "data_seconds: 0.03\n",
        J,
        None,
        {"input_stall"},
        _culprit("input_stall", ranks=list(range(32))),
    ),
    (
        "sim foreign traffic 60-110",
        BIG,
        J + f"foreign: [{{links: [{NIC0}], scale: 0.2, from_step: 60, to_step: 110}}]",
        None,
        {"topology_contention"},
        _period(60, 109),
    ),
    (
        "sim slow links vs model",
        BIG,
        J + f"links: [{NIC1}]",
        "single-switch",
        {"topology_contention"},
        _culprit("topology_contention"),
    ),
]


def score(d: Diagnosis, modes: set[str], check: Check) -> tuple[bool, bool]:
    got = {f.mode for f in d.findings}
    mode_ok = got == modes and (d.healthy if not modes else True)
    return mode_ok, mode_ok and check(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("/tmp/fabricpace-acc"))
    args = ap.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    rows: list[tuple[str, int, int, int, list[str]]] = []
    t0 = time.perf_counter()
    for i, (name, spec, modes, check) in enumerate(SYNTH):
        m = c = 0
        wrong: list[str] = []
        for seed in range(args.seeds):
            run = write_synthetic(args.out / f"s{i}-{seed}", SynthSpec(**{**B, **spec, "seed": seed}))
            d = diagnose([run])
            mo, co = score(d, modes, check)
            m, c = m + mo, c + co
            if not mo:
                wrong.append(",".join(sorted(f.mode for f in d.findings)) or d.runs[0].verdict)
        rows.append((f"synthetic: {name}", args.seeds, m, c, wrong))
    try:
        from fabricpace.sim import simulate
    except ImportError:
        simulate = None  # type: ignore[assignment]
    if simulate is not None:
        for i, (name, wl, nz, cluster, modes, check) in enumerate(SIM):
            m = c = 0
            wrong = []
            for seed in range(max(1, args.seeds // 2 + 1)):
                folder = args.out / f"sim{i}-{seed}"
                folder.mkdir()
                (folder / "w.yaml").write_text(wl)
                (folder / "n.yaml").write_text(nz)
                run = simulate(
                    "single-switch",
                    folder / "w.yaml",
                    folder / "n.yaml",
                    nodes=4,
                    steps=160,
                    seed=seed,
                    out_dir=folder / "run",
                )
                d = diagnose([run], cluster=cluster)
                mo, co = score(d, modes, check)
                m, c = m + mo, c + co
                if not mo:
                    wrong.append(",".join(sorted(f.mode for f in d.findings)) or d.runs[0].verdict)
            rows.append((name, max(1, args.seeds // 2 + 1), m, c, wrong))
    width = max(len(r[0]) for r in rows)
    print(f"{'case':<{width}}  runs  mode right  culprit right  wrong verdicts")
    tot = [0, 0, 0]
    for name, n, m, c, wrong in rows:
        print(f"{name:<{width}}  {n:>4}  {m:>10}  {c:>13}  {'; '.join(wrong) or '-'}")
        tot[0] += n
        tot[1] += m
        tot[2] += c
    print(
        f"{'TOTAL':<{width}}  {tot[0]:>4}  {tot[1]:>10}  {tot[2]:>13}   "
        f"(mode {tot[1] / tot[0]:.1%}, culprit {tot[2] / tot[0]:.1%}; {time.perf_counter() - t0:.0f} s)"
    )


if __name__ == "__main__":
    main()
