"""Pacing in the simulator: baseline vs paced on `paper` and on scenarios that stress the guard.

    .venv/bin/python benchmarks/pacing_sim.py                         # every scenario, 4/8/16 nodes
    .venv/bin/python benchmarks/pacing_sim.py --only paper --seeds 10
    .venv/bin/python benchmarks/pacing_sim.py --random 8              # + 8 random noise compositions
    .venv/bin/python benchmarks/pacing_sim.py unseen --points 60      # random clusters x workloads x
                                                                      # nodes 2-32 x noise families
    .venv/bin/python benchmarks/pacing_sim.py decompose --seeds 5     # what each noise source costs,
                                                                      # and each actuator pinned on
    .venv/bin/python benchmarks/pacing_sim.py calibrate --seeds 3     # baseline-only re-calibration
                                                                      # candidates (docs/simulator.md)
    .venv/bin/python benchmarks/pacing_sim.py repath --nodes 16       # oracle: best of 8 ECMP draws

Each run is one ``fabricpace.sim.simulate`` call measured by the study's own ``summarize_run``
(iteration time = last rank's end - first rank's start; throughput over the counted steps), exactly
what ``fabricpace study --backend sim --compare baseline,paced`` does, in-process because a run takes
a fraction of a second. Paced runs use the same ``Controller(policies="auto", leaves=...)`` the study
builds. Seed i is used by both arms (the same noise draws); the printed Δ is the mean of the paired
relative throughput differences with a Student-t 95% CI over seeds, and a verdict: "better" (CI above
0), "WORSE" (CI below 0) or "no change".

The scenarios besides `paper` are written here (they are not shipped): each stresses one thing the
guard must get right — a failure mode pacing can act on (gc, slow rank), noise it cannot act on
(jitter, host pauses, tenants, ECMP, a slow link), and random compositions. Nothing in the simulator
or the scenarios is tuned for pacing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from fabricpace._errors import InputError
from fabricpace.fabric import load_cluster
from fabricpace.pacing import Controller, PacingConfig
from fabricpace.pacing.state import PacingState
from fabricpace.run.reader import load_run
from fabricpace.sim import SimOptions, load_workload, rank_leaves, resolve_node_order, simulate, twin_policies
from fabricpace.sim.noise import Noise, NoiseSpec, load_noise
from fabricpace.study.metrics import summarize_run

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "src/fabricpace/data/scenarios/paper"

_UPLINKS = [f"leaf{i}->spine{i % 4}" for i in range(8)] + [f"spine{i % 4}->leaf{i}" for i in range(8)]

# Other noise scenarios on the paper's cluster and workload (YAML, as `--noise` files would be).
NOISE: dict[str, str] = {
    "healthy": "name: healthy\njitter: {cv: 0.02}\n",
    "gc-heavy": (
        "name: gc-heavy\njitter: {cv: 0.02}\n"
        "gc: {garbage_mb_per_step: 20, garbage_cv: 0.3, threshold_mb: 400, threshold_cv: 0.1,\n"
        "     pause_ms_base: 5, pause_ms_per_mb: 0.1, baseline_rss_mb: 6000}\n"
    ),
    # GC costing about the trigger's share: a small true gain, hard to confirm.
    "gc-mild": (
        "name: gc-mild\njitter: {cv: 0.03}\n"
        "gc: {garbage_mb_per_step: 8, threshold_mb: 800, pause_ms_base: 30, pause_ms_per_mb: 0.02}\n"
    ),
    "slow-rank": "name: slow-rank\njitter: {cv: 0.02}\nslow:\n  - {rank: 3, factor: 1.3}\n",
    # A node 8% slow: rebalance at 12 samples/GPU can move only whole samples.
    "slow-node-mild": "name: slow-node-mild\njitter: {cv: 0.02}\nslow:\n  - {node: 1, factor: 1.08}\n",
    "host-pauses": (
        "name: host-pauses\njitter: {cv: 0.03}\npauses: {rate_hz: 2.0, duration_ms: 5, duration_cv: 1.0}\n"
    ),
    "jitter-heavy": "name: jitter-heavy\njitter: {cv: 0.08, distribution: lognormal}\n",
    # Tenants on every used uplink pair, half the capacity, 40% of the time: comm inflation pacing
    # cannot remove (the comm twin can only delay launches).
    "tenant-heavy": (
        "name: tenant-heavy\njitter: {cv: 0.02}\nforeign:\n"
        + "".join(
            f"  - {{links: [{_UPLINKS[i]}, {_UPLINKS[8 + i]}], scale: 0.5, duty: 0.4, burst_steps: 15}}\n"
            for i in range(8)
        )
    ),
    "slow-link": "name: slow-link\njitter: {cv: 0.02}\nlinks:\n  - {link: leaf0->spine0, scale: 0.4}\n",
    "flapping-link": (
        "name: flapping-link\njitter: {cv: 0.02}\nlinks:\n"
        "  - {link: leaf1->spine1, scale: 0.3, flap_period_steps: 60, flap_down_steps: 20}\n"
    ),
}
# ECMP-heavy: no host noise at all, every collision of the paper cluster's plain ECMP shows.
ECMP_ONLY = "ecmp-only"


def random_noise(k: int) -> NoiseSpec:
    """A random composition of noise sources (seeded by ``k``): each present with probability ~1/2."""
    rng = np.random.default_rng([0xC0FFEE, k])
    d: dict[str, Any] = {"name": f"random-{k}", "jitter": {"cv": float(rng.uniform(0.0, 0.06))}}
    if rng.random() < 0.5:
        d["gc"] = {
            "garbage_mb_per_step": float(rng.uniform(2, 25)),
            "threshold_mb": float(rng.uniform(200, 1500)),
            "pause_ms_base": float(rng.uniform(1, 60)),
            "pause_ms_per_mb": float(rng.uniform(0.0, 0.1)),
        }
    if rng.random() < 0.5:
        d["pauses"] = {"rate_hz": float(rng.uniform(0.1, 3)), "duration_ms": float(rng.uniform(1, 10))}
    if rng.random() < 0.5:
        if rng.random() < 0.5:
            d["slow"] = [{"rank": int(rng.integers(0, 32)), "factor": float(rng.uniform(1.02, 1.4))}]
        else:
            d["slow"] = [{"node": int(rng.integers(0, 4)), "factor": float(rng.uniform(1.02, 1.2))}]
    if rng.random() < 0.5:
        n = int(rng.integers(1, 9))
        d["foreign"] = [
            {"links": [_UPLINKS[i], _UPLINKS[8 + i]], "scale": float(rng.uniform(0.3, 0.9)),
             "duty": float(rng.uniform(0.05, 0.6)), "burst_steps": float(rng.uniform(3, 40))}
            for i in rng.choice(8, size=n, replace=False)
        ]
    if rng.random() < 0.3:
        d["links"] = [{"link": _UPLINKS[int(rng.integers(0, 16))], "scale": float(rng.uniform(0.3, 0.9))}]
    return NoiseSpec.model_validate(d)


# ---------------------------------------------------------------------------------------------- runs
_T975 = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14, 2.13,
         2.12, 2.11, 2.10, 2.09, 2.09]


def t975(df: int) -> float:
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96 + 2.4 / max(df, 1)


CLUSTER: Any = PAPER / "cluster.yaml"  # --cluster replaces it
WORKLOAD: Any = PAPER / "workload.yaml"  # --workload replaces it


def cluster(routing: str = "ecmp") -> Any:
    cl = load_cluster(CLUSTER)
    if routing == "ecmp":
        return cl
    return cl.model_copy(update={"network": cl.network.model_copy(update={"routing": routing})})


@dataclass(frozen=True)
class Run:
    throughput: float
    cv: float
    decisions: tuple[str, ...] = ()


def run(
    noise: NoiseSpec,
    *,
    nodes: int,
    seed: int,
    mode: str | PacingState = "baseline",
    cl: Any = None,
    config: PacingConfig | None = None,
    steps: int = 300,
    warmup: int = 50,
    window: int = 50,
    wl: Any = None,
    node_order: str = "packed",
) -> Run:
    """One simulated run: mode "baseline", "paced" (auto controller + guard) or a pinned state.
    ``node_order`` "shuffled" launches the nodes in a rendezvous order drawn from the seed (both modes
    of a seed get the same order); the paced controller is told each rank's leaf, as the study does."""
    cl = cl if cl is not None else cluster()
    controller = None
    pinned = mode if isinstance(mode, PacingState) else None
    order = resolve_node_order(node_order, nodes=nodes, seed=seed)
    if mode == "paced":
        leaves = rank_leaves(cl, nodes=nodes, node_order=order)
        policies = twin_policies(load_workload(wl if wl is not None else WORKLOAD))
        controller = Controller(len(leaves), config or PacingConfig(), policies=policies, leaves=leaves)
    with tempfile.TemporaryDirectory(prefix="fp-pacing-sim-") as tmp:
        out = simulate(
            cl,
            wl if wl is not None else WORKLOAD,
            Noise(spec=noise, source=f"({noise.name})"),
            nodes=nodes,
            steps=steps,
            seed=seed,
            out_dir=Path(tmp) / "run",
            controller=controller,
            options=SimOptions(window=window, record_collectives=False, pinned=pinned),
            node_order=None if order is None else order.tolist(),
        )
        row = summarize_run(load_run(out), warmup)
    dec = tuple(f"{d.step}:{d.policy}/{d.action}" for d in controller.decisions) if controller else ()
    return Run(throughput=float(row["throughput"]), cv=float(row["cv"]), decisions=dec)


CV_FLOOR = 0.001  # smallest CV change the verdict reports (one unit of the third decimal)


@dataclass(frozen=True)
class Paired:
    n: int
    base: float
    other: float
    delta_pct: float
    ci_lo: float
    ci_hi: float
    cv_base: float
    cv_other: float
    # paired change of the CV (other - base) and its Student-t 95% CI over seeds
    cv_delta: float = 0.0
    cv_lo: float = 0.0
    cv_hi: float = 0.0

    @property
    def verdict(self) -> str:
        return "better" if self.ci_lo > 0 else "WORSE" if self.ci_hi < 0 else "no change"

    @property
    def cv_verdict(self) -> str:
        """Lower CV is better: "CV WORSE" when the whole CI of the paired CV change lies above
        ``CV_FLOOR`` (a change that a CV printed to 3 decimals cannot show is not a finding, even when
        every seed moves by the same hair and the CI has no width)."""
        if self.cv_hi < -CV_FLOOR:
            return "CV lower"
        return "CV WORSE" if self.cv_lo > CV_FLOOR else "CV same"

    def line(self) -> str:
        return (
            f"{self.base:8.1f} -> {self.other:8.1f}  Δ {self.delta_pct:+6.2f}% "
            f"(95% CI {self.ci_lo:+.2f}..{self.ci_hi:+.2f}, n={self.n})  "
            f"CV {self.cv_base:.3f} -> {self.cv_other:.3f} (Δ {self.cv_delta:+.3f}, "
            f"CI {self.cv_lo:+.3f}..{self.cv_hi:+.3f})  {self.verdict}, {self.cv_verdict}"
        )


def paired(base: Sequence[Run], other: Sequence[Run]) -> Paired:
    """Mean of paired relative throughput differences (same seeds), Student-t 95% CI over seeds."""
    b = np.array([r.throughput for r in base])
    o = np.array([r.throughput for r in other])
    d = (o / b - 1.0) * 100.0
    m, half = _mean_ci(d)
    dcv = np.array([y.cv - x.cv for x, y in zip(base, other, strict=True)])
    mc, hc = _mean_ci(dcv)
    return Paired(
        n=int(d.size), base=float(b.mean()), other=float(o.mean()), delta_pct=m, ci_lo=m - half,
        ci_hi=m + half, cv_base=float(np.mean([r.cv for r in base])),
        cv_other=float(np.mean([r.cv for r in other])), cv_delta=mc, cv_lo=mc - hc, cv_hi=mc + hc,
    )


def _mean_ci(d: np.ndarray) -> tuple[float, float]:
    """Mean and Student-t 95% half-width (0 when every paired difference is the same)."""
    m = float(d.mean())
    if d.size < 2:
        return m, math.nan
    return m, t975(d.size - 1) * float(d.std(ddof=1)) / math.sqrt(d.size)


def without(spec: NoiseSpec, *parts: str) -> NoiseSpec:
    """The noise with some sources switched off: jitter, gc, slow, pauses, foreign, links."""
    update: dict[str, Any] = {}
    for p in parts:
        if p == "jitter":
            update["jitter"] = spec.jitter.model_copy(update={"cv": 0.0})
        elif p == "gc":
            update["gc"] = spec.gc.model_copy(update={"garbage_mb_per_step": 0.0})
        elif p == "pauses":
            update["pauses"] = spec.pauses.model_copy(update={"rate_hz": 0.0})
        elif p in ("slow", "foreign", "links"):
            update[p] = []
        else:
            raise ValueError(f"unknown noise part {p!r}")
    return spec.model_copy(update=update)


def scenario(name: str) -> tuple[NoiseSpec, Any]:
    """(noise, cluster) of a named scenario."""
    if name == "paper":
        return load_noise(PAPER / "noise.yaml").spec, cluster()
    if name == ECMP_ONLY:
        return NoiseSpec(name=ECMP_ONLY), cluster()
    if name.startswith("random-"):
        return random_noise(int(name.split("-", 1)[1])), cluster()
    import yaml

    return NoiseSpec.model_validate(yaml.safe_load(NOISE[name])), cluster()


# ------------------------------------------------------------------------------------------ commands
def compare(args: argparse.Namespace, config: PacingConfig) -> dict[str, Any]:
    names = args.only or ["paper", *NOISE, ECMP_ONLY]
    names += [f"random-{k}" for k in range(args.random)]
    nodes = [int(x) for x in args.nodes.split(",")]
    seeds = range(args.seed, args.seed + args.seeds)
    results: dict[str, Any] = {}
    worse = 0
    for name in names:
        noise, cl = scenario(name)
        for n in nodes:
            try:
                base = [run(noise, nodes=n, seed=s, cl=cl, steps=args.steps) for s in seeds]
            except InputError as exc:  # e.g. a tenant on a link this cluster does not have
                print(f"{name:15s} {n:3d} nodes  skipped: {exc}", flush=True)
                continue
            paced = [run(noise, nodes=n, seed=s, cl=cl, mode="paced", config=config, steps=args.steps)
                     for s in seeds]
            p = paired(base, paced)
            worse += p.verdict == "WORSE"
            kept = sum(any("keep" in d for d in r.decisions) for r in paced)
            trials = sum(sum("enable" in d for d in r.decisions) for r in paced)
            results[f"{name}/{n}"] = {**asdict(p), "verdict": p.verdict, "runs_with_keep": kept,
                                      "trials": trials}
            print(f"{name:15s} {n:3d} nodes  {p.line()}  trials {trials}, kept in {kept}/{p.n} runs",
                  flush=True)
            if args.verbose:
                for s, r in zip(seeds, paced, strict=True):
                    print(f"      seed {s}: {r.throughput:.1f}  {'; '.join(r.decisions)}", flush=True)
    print(f"scenario x nodes points worse beyond noise: {worse} of {len(results)}", flush=True)
    return results


# ------------------------------------------------------------------------ unseen scenarios (issue 6)
UNSEEN_CLUSTERS = ("dgx-h100-ib", "p5-efa", "roce-leaf-spine-2to1", "single-switch", "paper")
UNSEEN_WORKLOADS = ("paper", "bert-large", "gpt-1.3b", "gpt-7b", "resnet-50", "gpt-1.3b-fsdp")
UNSEEN_NODES = (2, 3, 4, 6, 8, 12, 16, 24, 32)
FAMILIES = ("gc", "slow-rank", "slow-node", "pauses", "tenants", "slow-link", "flapping-link")


@dataclass(frozen=True)
class Point:
    """One unseen scenario: cluster, workload, node count and a noise composition."""

    name: str
    cluster: str
    workload: str
    nodes: int
    families: tuple[str, ...]
    noise: NoiseSpec


def load_unseen_cluster(name: str) -> Any:
    return load_cluster(PAPER / "cluster.yaml" if name == "paper" else name)


def load_unseen_workload(name: str) -> Any:
    from fabricpace.sim.workload import Workload, load_workload

    if name == "paper":
        return load_workload(PAPER / "workload.yaml")
    if name.endswith("-fsdp"):  # the same model sharded with FSDP instead of replicated with DDP
        wl = load_workload(name.removesuffix("-fsdp"))
        par = wl.spec.parallelism.model_copy(update={"kind": "fsdp"})
        return Workload(spec=wl.spec.model_copy(update={"parallelism": par, "name": name}), source=name)
    return load_workload(name)


def unseen_point(k: int) -> Point:
    """Scenario ``k`` of the unseen-scenario check: everything drawn from a generator seeded by ``k``.

    Host noise (jitter always; GC, slow rank/node, host pauses) and fabric noise (tenant bursts, a slow
    or flapping link) on links the job really uses; slow ranks/nodes sometimes appear or recover
    mid-run. Each family is present with probability ~0.35 (at least one)."""
    from fabricpace.sim.transfers import link_names

    rng = np.random.default_rng([0xFAB1C, k])
    cname = str(rng.choice(UNSEEN_CLUSTERS))
    wname = str(rng.choice(UNSEEN_WORKLOADS))
    cl = load_unseen_cluster(cname)
    nodes = int(rng.choice([n for n in UNSEEN_NODES if n <= cl.nodes]))
    world = nodes * cl.gpus_per_node
    fams = [f for f in FAMILIES if rng.random() < 0.35] or [str(rng.choice(FAMILIES))]
    d: dict[str, Any] = {
        "name": f"unseen-{k}",
        "jitter": {"cv": float(rng.uniform(0.0, 0.06)),
                   "distribution": "lognormal" if rng.random() < 0.3 else "normal"},
    }
    names = link_names(cl, nodes) or []
    inter = [n for n in names if "nvlink" not in n]
    spine = [n for n in inter if "spine" in n] or inter

    def with_reverse(link: str) -> list[str]:
        a, _, b = link.partition("->")
        rev = f"{b}->{a}"
        return [link, rev] if rev in names else [link]

    def step_range() -> dict[str, int]:
        r = rng.random()
        if r < 0.2:
            return {"from_step": int(rng.integers(60, 200))}
        if r < 0.35:
            return {"to_step": int(rng.integers(80, 220))}
        return {}

    if "gc" in fams:
        d["gc"] = {
            "garbage_mb_per_step": float(rng.uniform(1, 30)),
            "garbage_cv": float(rng.uniform(0.0, 0.5)),
            "threshold_mb": float(rng.uniform(100, 2000)),
            "pause_ms_base": float(rng.uniform(0, 80)),
            "pause_ms_per_mb": float(rng.uniform(0.0, 0.15)),
            "young_pause_ms_base": float(rng.choice([0.0, rng.uniform(0.0, 3.0)])),
            "promoted_fraction": float(rng.uniform(0.3, 1.0)),
        }
    slow = []
    if "slow-rank" in fams:
        slow.append({"rank": int(rng.integers(0, world)), "factor": float(rng.uniform(1.02, 1.5)),
                     **step_range()})
    if "slow-node" in fams:
        slow.append({"node": int(rng.integers(0, nodes)), "factor": float(rng.uniform(1.02, 1.3)),
                     **step_range()})
    if slow:
        d["slow"] = slow
    if "pauses" in fams:
        d["pauses"] = {"rate_hz": float(rng.uniform(0.1, 4)), "duration_ms": float(rng.uniform(1, 20)),
                       "duration_cv": float(rng.uniform(0.2, 1.5))}
    if "tenants" in fams and spine:
        n = int(rng.integers(1, min(8, len(spine)) + 1))
        d["foreign"] = [
            {"links": with_reverse(str(spine[i])), "scale": float(rng.uniform(0.3, 0.9)),
             "duty": float(rng.uniform(0.05, 0.6)), "burst_steps": float(rng.uniform(3, 40))}
            for i in rng.choice(len(spine), size=n, replace=False)
        ]
    links = []
    if "slow-link" in fams and inter:
        links.append({"link": str(rng.choice(inter)), "scale": float(rng.uniform(0.3, 0.9))})
    if "flapping-link" in fams and inter:
        period = int(rng.integers(20, 120))
        links.append({"link": str(rng.choice(inter)), "scale": float(rng.uniform(0.2, 0.7)),
                      "flap_period_steps": period, "flap_down_steps": int(rng.integers(5, period // 2 + 6))
                      if period > 12 else 5})
    if links:
        d["links"] = links
    return Point(name=f"unseen-{k}", cluster=cname, workload=wname, nodes=nodes, families=tuple(fams),
                 noise=NoiseSpec.model_validate(d))


def unseen_node_order(k: int, how: str, wl: Any) -> str:
    """Launch order of unseen point ``k``: ``packed``, ``shuffled``, or for ``mixed`` a coin flip from
    its own stream (the noise draws of point ``k`` stay what they are with ``packed``). Only plain data
    parallelism models a node order."""
    par = wl.spec.parallelism
    if how == "packed" or par.tp > 1 or par.pp > 1:
        return "packed"
    if how == "shuffled":
        return "shuffled"
    return "shuffled" if np.random.default_rng([0x0D0, k]).random() < 0.5 else "packed"


def unseen(args: argparse.Namespace, config: PacingConfig) -> dict[str, Any]:
    """Baseline vs paced on ``--points`` random unseen scenarios, paired seeds, verdicts on both
    throughput and CV."""
    from rich.progress import Progress

    seeds = range(args.seed, args.seed + args.seeds)
    out: dict[str, Any] = {}
    worse = worse_cv = 0
    rows: list[str] = []
    first = args.first
    with Progress(transient=True, console=_stderr_console()) as bar:
        task = bar.add_task("unseen scenarios", total=args.points)
        for k in range(first, first + args.points):
            pt = unseen_point(k)
            cl, wl = load_unseen_cluster(pt.cluster), load_unseen_workload(pt.workload)
            order = unseen_node_order(k, args.node_order, wl)
            kw = {"nodes": pt.nodes, "cl": cl, "wl": wl, "steps": args.steps, "node_order": order}
            base = [run(pt.noise, seed=s, **kw) for s in seeds]
            paced = [run(pt.noise, seed=s, mode="paced", config=config, **kw) for s in seeds]
            p = paired(base, paced)
            worse += p.verdict == "WORSE"
            worse_cv += p.cv_verdict == "CV WORSE"
            kept = sum(any("keep" in d for d in r.decisions) for r in paced)
            trials = sum(sum("enable" in d for d in r.decisions) for r in paced)
            fam = "+".join(pt.families) + ("+shuffled" if order == "shuffled" else "")
            out[pt.name] = {"cluster": pt.cluster, "workload": pt.workload, "nodes": pt.nodes,
                            "families": fam, **asdict(p), "verdict": p.verdict, "cv_verdict": p.cv_verdict,
                            "trials": trials, "runs_with_keep": kept}
            print(f"{pt.name:10s} {pt.cluster:20s} {pt.workload:13s} {pt.nodes:3d}n {fam:30s} {p.line()}  "
                  f"trials {trials}, kept {kept}/{p.n}", flush=True)
            rows.append(
                f"| {pt.name} | {pt.cluster} | {pt.workload} | {pt.nodes} | {fam} | {p.base:.1f} | "
                f"{p.delta_pct:+.2f}% ({p.ci_lo:+.2f}..{p.ci_hi:+.2f}) | {p.cv_base:.3f} → {p.cv_other:.3f} "
                f"({p.cv_delta:+.3f}, {p.cv_lo:+.3f}..{p.cv_hi:+.3f}) | {p.verdict}, {p.cv_verdict} | "
                f"{trials} | {kept}/{p.n} |"
            )
            if args.verbose:
                for s, r in zip(seeds, paced, strict=True):
                    print(f"      seed {s}: {r.throughput:.1f} cv {r.cv:.3f}  {'; '.join(r.decisions)}",
                          flush=True)
            bar.advance(task)
    summary = (f"unseen points worse beyond noise: throughput {worse} of {len(out)}, "
               f"CV {worse_cv} of {len(out)} (n={args.seeds} paired seeds, {args.steps} steps)")
    print(summary, flush=True)
    if args.markdown:
        head = ("| point | cluster | workload | nodes | noise | baseline | Δ throughput (95% CI) | "
                "CV base → paced (Δ, 95% CI) | verdict | trials | runs kept |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|\n")
        Path(args.markdown).write_text(f"{summary}\n\n" + head + "\n".join(rows) + "\n")
    return out


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def decompose(args: argparse.Namespace, config: PacingConfig) -> dict[str, Any]:
    """Baseline with each noise source off in turn, and each actuator pinned on from step 0."""
    noise, cl = scenario(args.only[0] if args.only else "paper")
    seeds = range(args.seed, args.seed + args.seeds)
    everything = ("jitter", "gc", "slow", "pauses", "foreign", "links")
    host = ("jitter", "gc", "slow", "pauses")
    out: dict[str, Any] = {}
    for n in [int(x) for x in args.nodes.split(",")]:
        world = n * cl.gpus_per_node
        factor = np.ones(world)
        for sl in noise.slow:
            ranks = np.arange(world)
            who = (ranks == sl.rank) if sl.rank is not None else (ranks // cl.gpus_per_node == sl.node)
            factor[who] *= sl.factor
        speed = 1.0 / factor
        true_shares = PacingState(shares=tuple(float(x) for x in speed / speed.sum()))
        # label -> (noise, cluster, mode)
        arms: dict[str, tuple[NoiseSpec, Any, str | PacingState]] = {
            **{f"without {p}": (without(noise, p), cl, "baseline") for p in everything[:-1]},
            "without ECMP (spray)": (noise, cluster("spray"), "baseline"),
            "without host noise": (without(noise, *host), cl, "baseline"),
            "without fabric noise": (without(noise, "foreign", "links"), cluster("spray"), "baseline"),
            "without everything": (without(noise, *everything), cluster("spray"), "baseline"),
            "oracle gc lockstep/1": (noise, cl, PacingState(gc_interval=1)),
            "oracle gc lockstep/10": (noise, cl, PacingState(gc_interval=10)),
            "oracle rebalance (true speeds)": (noise, cl, true_shares),
            "oracle gc/1 + rebalance": (noise, cl, replace(true_shares, gc_interval=1)),
            "oracle comm window 2": (noise, cl, PacingState(comm_window=2)),
            "oracle comm window 1": (noise, cl, PacingState(comm_window=1)),
            "paced (auto + guard)": (noise, cl, "paced"),
        }
        base = [run(noise, nodes=n, seed=s, cl=cl, steps=args.steps) for s in seeds]
        p0 = paired(base, base)
        print(f"== {noise.name}, {n} nodes: baseline {p0.base:.1f} samples/s, CV {p0.cv_base:.3f}",
              flush=True)
        for label, (nz, c, mode) in arms.items():
            runs = [run(nz, nodes=n, seed=s, cl=c, mode=mode, config=config, steps=args.steps)
                    for s in seeds]
            p = paired(base, runs)
            out[f"{n}/{label}"] = {**asdict(p), "verdict": p.verdict}
            print(f"   {label:31s} {p.line()}", flush=True)
    return out



def repath(args: argparse.Namespace, config: PacingConfig) -> dict[str, Any]:
    """Oracle for an actuator fabricpace does not have: re-drawing the job's ECMP paths.

    On RoCE a connection's path is fixed by its UDP source port, derived from its queue pairs; a job
    that re-created its communicators (new queue pairs) would get a new draw. This runs the baseline
    with ``--draws`` different draws per seed (same noise draws) and reports what keeping the best of
    the first k would give: an upper bound for such an actuator, its trials and restarts not charged."""
    import fabricpace.sim.transfers as transfers

    noise, cl = scenario(args.only[0] if args.only else "paper")
    seeds = list(range(args.seed, args.seed + args.seeds))
    stream = transfers._ECMP_STREAM  # private on purpose: a what-if the simulator does not offer
    out: dict[str, Any] = {}
    for n in [int(x) for x in args.nodes.split(",")]:
        tp = np.zeros((len(seeds), args.draws))
        cv = np.zeros_like(tp)
        try:
            for i, s in enumerate(seeds):
                for r in range(args.draws):
                    transfers._ECMP_STREAM = stream + r
                    x = run(noise, nodes=n, seed=s, cl=cl, steps=args.steps)
                    tp[i, r], cv[i, r] = x.throughput, x.cv
        finally:
            transfers._ECMP_STREAM = stream
        print(f"== {noise.name}, {n} nodes: {len(seeds)} seeds x {args.draws} ECMP draws; draw 0 is the "
              f"baseline ({tp[:, 0].mean():.1f} samples/s, CV {cv[:, 0].mean():.3f})", flush=True)
        for k in sorted({1, 2, 4, args.draws}):
            best = tp[:, :k].argmax(axis=1)
            gain = 100.0 * (tp[np.arange(len(seeds)), best] / tp[:, 0] - 1.0)
            m, h = _mean_ci(gain)
            cv_k = float(cv[np.arange(len(seeds)), best].mean())
            out[f"{n}/best of {k}"] = {"gain_pct": m, "ci": h, "cv": cv_k}
            print(f"   best of {k} draws: {m:+.2f}% (95% CI {m - h:+.2f}..{m + h:+.2f}, n={len(seeds)}), "
                  f"CV {cv_k:.3f}", flush=True)
    return out

# Baseline-only candidates for re-attributing the paper scenario's 16-node instability to host-side
# synchronization skew (issue 6): the paper noise with larger, rarer full GC collections (Python full
# collections of a few million tracked objects take 100-300 ms; measured ~65 ns per tracked object
# here) and fewer tenant bursts. Each is run WITHOUT pacing only; see docs/simulator.md.
CALIBRATION: dict[str, dict[str, Any]] = {
    "paper (shipped)": {},
    "gc 100ms/~1000 steps, tenants 10%": {
        "gc": {"threshold_mb": 8000, "pause_ms_base": 100, "pause_ms_per_mb": 0.0}, "duty": 0.1},
    "gc 150ms/~2000 steps, tenants 10%": {
        "gc": {"threshold_mb": 16000, "pause_ms_base": 150, "pause_ms_per_mb": 0.0}, "duty": 0.1},
    "gc 60ms/~400 steps, tenants 10%": {
        "gc": {"threshold_mb": 3000, "pause_ms_base": 60, "pause_ms_per_mb": 0.0}, "duty": 0.1},
    "gc 40ms/~200 steps": {"gc": {"threshold_mb": 1500, "pause_ms_base": 40, "pause_ms_per_mb": 0.0}},
    "gc 150ms/~500 steps": {"gc": {"threshold_mb": 4000, "pause_ms_base": 150, "pause_ms_per_mb": 0.0}},
}


def calibrate(args: argparse.Namespace, config: PacingConfig) -> dict[str, Any]:
    """Baseline throughput and CV of the calibration candidates (no paced run) at 4/8/16 nodes."""
    noise, cl = scenario("paper")
    seeds = range(args.seed, args.seed + args.seeds)
    out: dict[str, Any] = {}
    print("target (paper, baseline): 4: 1024 CV 0.02 | 8: 1980 CV 0.04 | 16: 3600 CV 0.09", flush=True)
    for label, change in CALIBRATION.items():
        d = noise.model_dump()
        d["gc"].update(change.get("gc", {}))
        for f in d["foreign"]:
            f["duty"] = change.get("duty", f["duty"])
        spec = NoiseSpec.model_validate(d)
        cells = []
        for n in [int(x) for x in args.nodes.split(",")]:
            runs = [run(spec, nodes=n, seed=s, cl=cl, steps=args.steps) for s in seeds]
            quiet_host = without(spec, "jitter", "gc", "slow", "pauses")
            host = [run(quiet_host, nodes=n, seed=s, cl=cl, steps=args.steps) for s in seeds]
            tp, cv = float(np.mean([r.throughput for r in runs])), float(np.mean([r.cv for r in runs]))
            cv_fabric = float(np.mean([r.cv for r in host]))
            out[f"{label}/{n}"] = {"throughput": tp, "cv": cv, "cv_without_host_noise": cv_fabric}
            cells.append(f"{n}: {tp:6.0f} CV {cv:.3f} (no host noise {cv_fabric:.3f})")
        print(f"{label:36s} " + " | ".join(cells), flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", nargs="?", default="compare",
                    choices=["compare", "unseen", "decompose", "calibrate", "repath"])
    ap.add_argument("--only", action="append", help="scenario(s): paper, ecmp-only, random-K or a NOISE name")
    ap.add_argument("--random", type=int, default=0, help="add this many random noise compositions")
    ap.add_argument("--points", type=int, default=40, help="unseen: number of random scenarios")
    ap.add_argument("--first", type=int, default=0, help="unseen: index of the first scenario")
    ap.add_argument("--markdown", default="", help="unseen: also write the table here (Markdown)")
    ap.add_argument("--seeds", type=int, default=5, help="paired seeds per point")
    ap.add_argument("--seed", type=int, default=1, help="first seed (the study's default is 1)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--draws", type=int, default=8, help="repath: ECMP draws per seed")
    ap.add_argument("--nodes", default="4,8,16")
    ap.add_argument("--workload", default="", help="workload preset or file (default: the paper's)")
    ap.add_argument("--cluster", default="", help="cluster preset or file (default: the paper's)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="PacingConfig override for the paced arm, e.g. --set guard_max_pairs=4")
    ap.add_argument("--verbose", action="store_true", help="print each paced run's decisions")
    ap.add_argument("--node-order", default="packed", choices=("packed", "shuffled", "mixed"),
                    help="unseen: launch order of the nodes (mixed: shuffled for about half the points)")
    ap.add_argument("--json", default="", help="also write the results here")
    args = ap.parse_args(argv)
    global CLUSTER, WORKLOAD
    CLUSTER = args.cluster or CLUSTER
    WORKLOAD = args.workload or WORKLOAD
    overrides = {k: float(v) if "." in v else int(v) for k, v in (s.split("=", 1) for s in args.set)}
    config = PacingConfig().with_overrides(**overrides)
    commands = {"compare": compare, "unseen": unseen, "decompose": decompose, "calibrate": calibrate,
                "repath": repath}
    res = commands[args.command](args, config)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
