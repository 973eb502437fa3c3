"""Scaling studies: run (nodes × mode × repeat) points on a backend, then summarize every run the same way.

Backends: ``sim`` runs in this process (``fabricpace.sim.simulate``); ``local`` and ``lab`` are modules
``fabricpace.study.local`` / ``fabricpace.study.lab`` with ``run_point(*, nodes, mode, steps, seed,
out_dir, scenario) -> Path``, imported by name. Every row comes from ``metrics.summarize_run`` on the run
directory, whatever produced it. Repeat ``i`` uses seed ``seed + i`` in every mode, so baseline and
paced runs of one repeat see the same noise draws (common random numbers: a paired comparison).
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fabricpace._errors import InputError
from fabricpace.run.destination import check_new_dir
from fabricpace.run.reader import load_run
from fabricpace.study.metrics import summarize_run
from fabricpace.study.stats import mean_ci, paired_delta

BACKENDS = ("sim", "local", "lab")
MODES = ("baseline", "paced")


@dataclass(frozen=True, kw_only=True)
class StudyPlan:
    backend: str
    nodes: tuple[int, ...]
    modes: tuple[str, ...]
    repeats: int
    steps: int
    warmup: int
    seed: int
    out_dir: Path
    cluster: str | None = None
    workload: str | None = None
    noise: str | None = None
    scenario: str | None = None
    window: int = 50
    node_order: str = "packed"  # sim: packed | shuffled (rendezvous order drawn per seed)

    def points(self) -> list[tuple[int, str, int]]:
        # Interleave modes within a repeat so slow drift on real backends hits both modes alike.
        return [(n, m, r) for n in self.nodes for r in range(self.repeats) for m in self.modes]


@dataclass(kw_only=True)
class StudyResult:
    plan: StudyPlan
    points: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        plan = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.plan).items()}
        return {"plan": plan, "rows": self.rows, "points": self.points}


def check_plan(plan: StudyPlan) -> None:
    if plan.backend not in BACKENDS:
        raise InputError(f"--backend {plan.backend!r}: choose one of {', '.join(BACKENDS)}")
    bad = [m for m in plan.modes if m not in MODES]
    if bad or not plan.modes:
        raise InputError(f"--compare {','.join(plan.modes)!r}: modes are {', '.join(MODES)}")
    again = [m for i, m in enumerate(plan.modes) if m in plan.modes[:i]]
    if again:
        # Each (nodes, mode, repeat) point has one run folder: a repeated mode ran into the folder it had
        # just written, half-way through the study.
        raise InputError(
            f"--compare {','.join(plan.modes)}: mode {again[0]} is given twice; give each mode once "
            "(use --repeats for more runs)"
        )
    if not plan.nodes or min(plan.nodes) < 1:
        raise InputError(f"--nodes {','.join(map(str, plan.nodes))}: node counts must be at least 1")
    twice = sorted({n for n in plan.nodes if plan.nodes.count(n) > 1})
    if twice:
        # Each (nodes, mode, repeat) point has one run folder; a repeated count would run into its own.
        raise InputError(
            f"--nodes {','.join(map(str, plan.nodes))}: node count {twice[0]} is given twice; "
            "give each node count once (use --repeats for more runs)"
        )
    if plan.repeats < 1:
        raise InputError(f"--repeats {plan.repeats}: must be at least 1")
    if plan.seed < 0:
        raise InputError(f"--seed {plan.seed}: must be 0 or more (repeat i uses seed + i)")
    if plan.warmup < 0 or plan.steps < plan.warmup + 2:
        raise InputError(
            f"--steps {plan.steps} / --warmup {plan.warmup}: need at least warmup + 2 steps to measure"
        )
    from fabricpace.sim import NODE_ORDERS

    if plan.node_order not in NODE_ORDERS:
        raise InputError(f"--node-order {plan.node_order!r}: choose one of {', '.join(NODE_ORDERS)}")
    if plan.backend != "sim" and min(plan.nodes) < 2:
        # fabricpace.lab.launcher.run_scenario refuses it too, but only once the study folder exists.
        raise InputError(
            f"--nodes {','.join(map(str, plan.nodes))}: a {plan.backend} run needs at least 2 ranks "
            "(one process per node)"
        )
    if plan.backend != "sim" and plan.node_order != "packed":
        raise InputError(f"--node-order {plan.node_order}: only the sim backend models the node order")
    if plan.backend == "sim" and (plan.cluster is None or plan.workload is None):
        raise InputError("study --backend sim needs --cluster and --workload, or --scenario NAME|DIR")
    if plan.backend == "sim":
        from fabricpace.sim import check_job

        # What simulate() would refuse (nodes beyond the cluster, tp/pp that do not divide, a fault on a
        # rank the job lacks) fails here, before the study folder exists, not after some of its runs.
        # (The seed only draws the shuffled node order, which cannot fail: one seed checks them all.)
        for nodes in plan.nodes:
            check_job(
                plan.cluster,
                plan.workload,  # type: ignore[arg-type]
                plan.noise,
                nodes=nodes,
                steps=plan.steps,
                seed=plan.seed,
                node_order=plan.node_order,
            )


def _backend_module(name: str) -> Any:
    try:
        return importlib.import_module(f"fabricpace.study.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"fabricpace.study.{name}":
            raise
        raise InputError(
            f"--backend {name}: backend module fabricpace.study.{name} is not available in this install; "
            "use --backend sim"
        ) from exc


def _sim_point(
    plan: StudyPlan,
    *,
    nodes: int,
    mode: str,
    seed: int,
    out_dir: Path,
    steps_done: Callable[[int], None] | None = None,
) -> Path:
    from fabricpace.sim import SimOptions, resolve_node_order, simulate

    # Both modes of a repeat launch in the same order (the same seed draws the same rendezvous).
    order = resolve_node_order(plan.node_order, nodes=nodes, seed=seed)
    controller = None
    if mode == "paced":
        controller = _make_controller(plan, nodes, order)
    return simulate(
        plan.cluster,
        plan.workload,  # type: ignore[arg-type]
        plan.noise,
        nodes=nodes,
        steps=plan.steps,
        seed=seed,
        out_dir=out_dir,
        controller=controller,
        progress=steps_done,
        options=SimOptions(window=plan.window),
        node_order=None if order is None else order.tolist(),
    )


def _make_controller(plan: StudyPlan, nodes: int, order: Any = None) -> Any:
    try:
        from fabricpace.pacing import Controller
    except ImportError as exc:
        raise InputError(
            "--compare paced: the pacing controller (fabricpace.pacing) is not available"
        ) from exc
    from fabricpace.fabric import load_cluster

    cl = load_cluster(plan.cluster)  # type: ignore[arg-type]
    from fabricpace.sim import load_workload, rank_leaves, twin_policies

    # The same policies as the observer's pacing="auto" (rebalance only for data parallelism); each
    # rank's leaf as launched.
    leaves = rank_leaves(cl, nodes=nodes, node_order=order)
    policies = twin_policies(load_workload(plan.workload))  # type: ignore[arg-type]
    return Controller(len(leaves), policies=policies, leaves=leaves)


def run_point(
    plan: StudyPlan,
    *,
    nodes: int,
    mode: str,
    repeat: int,
    steps_done: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run one point and summarize its run directory (``steps_done(n)``: n more steps simulated; sim only)."""
    seed = plan.seed + repeat
    out = plan.out_dir / "runs" / f"{plan.backend}-n{nodes}-{mode}-r{repeat}"
    if plan.backend == "sim":
        run_dir = _sim_point(plan, nodes=nodes, mode=mode, seed=seed, out_dir=out, steps_done=steps_done)
    else:
        mod = _backend_module(plan.backend)
        run_dir = Path(
            mod.run_point(
                nodes=nodes, mode=mode, steps=plan.steps, seed=seed, out_dir=out, scenario=plan.scenario
            )
        )
    run = load_run(run_dir, tables=("steps", "pacing"))
    summary = summarize_run(run, plan.warmup)
    return {
        "backend": plan.backend,
        "nodes": nodes,
        "mode": mode,
        "repeat": repeat,
        "seed": seed,
        "run_dir": str(run_dir),
        **summary,
        # Rows of the run's pacing.parquet (none: the file is absent). A paced run whose controller
        # decided nothing is the baseline run again, and its row equal to the baseline's bit for bit;
        # without this count the table could not tell "pacing found nothing to do" from "pacing did
        # not run".
        "pacing_decisions": run.pacing.height if mode == "paced" else None,
    }


def _decisions(pts: list[dict[str, Any]]) -> int | None:
    total = 0
    for p in pts:
        c = p.get("pacing_decisions")
        if c is None:
            return None
        total += int(c)
    return total


def aggregate(plan: StudyPlan, points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table-1 rows: per (nodes, mode) mean throughput with 95% CI, CV with its CI, efficiency, delta vs
    baseline, and (paced) the number of pacing decisions its runs recorded."""
    rows: list[dict[str, Any]] = []
    by: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for p in points:
        by.setdefault((p["nodes"], p["mode"]), []).append(p)
    smallest = min(plan.nodes)
    for mode in plan.modes:
        for nodes in sorted(plan.nodes):
            pts = sorted(by.get((nodes, mode), []), key=lambda p: p["repeat"])
            if not pts:
                continue
            thr, ci = mean_ci([p["throughput"] for p in pts])
            cv, cv_ci = mean_ci([p["cv"] for p in pts])
            row: dict[str, Any] = {
                "backend": plan.backend,
                "nodes": nodes,
                "mode": mode,
                "throughput": thr,
                "throughput_ci": list(ci) if ci else None,
                "cv": cv,
                # A CV is never negative; the t-interval of 2-3 repeats can reach below 0.
                "cv_ci": [max(0.0, cv_ci[0]), cv_ci[1]] if cv_ci else None,
                "efficiency": None,
                "steps": int(pts[0]["steps"]),
                "repeats": len(pts),
                "delta_pct": None,
                "delta_ci_pct": None,
                # summed over the repeats (study.json's points have each run's); None for baseline and
                # for points that did not count them
                "pacing_decisions": _decisions(pts) if mode == "paced" else None,
            }
            small = by.get((smallest, mode))
            if small:
                ref, _ = mean_ci([p["throughput"] for p in small])
                row["efficiency"] = (thr / nodes) / (ref / smallest) if ref > 0 else None
            base = by.get((nodes, "baseline"))
            if mode != "baseline" and base:
                b = {p["repeat"]: p["throughput"] for p in base}
                paired = [(b[p["repeat"]], p["throughput"]) for p in pts if p["repeat"] in b]
                d, dci = paired_delta([x for x, _ in paired], [y for _, y in paired])
                row["delta_pct"] = 100 * d
                row["delta_ci_pct"] = [100 * dci[0], 100 * dci[1]] if dci else None
            rows.append(row)
    return rows


def point_label(plan: StudyPlan, nodes: int, mode: str, repeat: int) -> str:
    """How progress names a point: ``sim 16 nodes paced #2`` (repeats count from 1)."""
    return f"{plan.backend} {nodes} nodes {mode} #{repeat + 1}"


def run_study(
    plan: StudyPlan,
    *,
    progress: Callable[[str], None] | None = None,
    starting: Callable[[str], None] | None = None,
    steps_done: Callable[[int], None] | None = None,
) -> StudyResult:
    """Run every point and write ``study.json``.

    ``starting(label)`` is called before a point runs and ``progress(label)`` after it, with the same
    label (``point_label``); ``steps_done(n)`` as the sim backend finishes n more steps of the running
    point. (A display that shows ``progress``'s label while the next point runs names the wrong point:
    the study bar used to say "16 nodes baseline #1" for the whole of "16 nodes paced #1".)
    """
    check_plan(plan)
    check_new_dir(plan.out_dir, what="study folder")
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    result = StudyResult(plan=plan)
    for nodes, mode, repeat in plan.points():
        label = point_label(plan, nodes, mode, repeat)
        if starting is not None:
            starting(label)
        result.points.append(run_point(plan, nodes=nodes, mode=mode, repeat=repeat, steps_done=steps_done))
        if progress is not None:
            progress(label)
    result.rows = aggregate(plan, result.points)
    tmp = plan.out_dir / f".study.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(result.to_dict(), indent=2, default=str))
    os.replace(tmp, plan.out_dir / "study.json")
    return result
