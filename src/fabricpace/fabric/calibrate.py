"""Calibration: fit the collective model's free parameters to nccl-tests logs taken at a few node counts.

What is fitted (``Tuning``): ``net_efficiency`` (share of NIC line rate a ring reaches),
``tree_efficiency`` (the same for NCCL's tree), ``nvls_tree_efficiency`` (the same for NVLS-tree),
``base_us`` (fixed cost per call) and ``net_overhead_us`` (the proxy's cost per network operation, which
paces every step of a ring that spans nodes). A value no calibration row depends on (no ring across nodes,
no tree, no NVLS-tree row) is not fitted: it keeps the cluster file's value instead of drifting to
whatever the optimiser leaves it at. Everything else comes from the cluster
file: link rates, topology, per-hop latencies (``latency_scale`` stays 1, because logs at two node counts
cannot tell a per-hop latency from the fixed cost). The algorithm and protocol of every point are *not*
given to the fit: the model's NCCL-like selection picks them, as it will when predicting; that choice
uses NCCL's own constants (collectives.py), so it does not move while the fit runs.

Objective: least squares on log(predicted / measured time) over the out-of-place times of every row
between ``min_bytes`` and ``max_bytes`` (default 32 MiB..8 GiB), minimised with Nelder-Mead on
transformed parameters (logit for efficiencies, log for times) from three starts.

``alpha_beta_fit`` fits the plain ring baseline T = 2(n-1)·alpha + 2(n-1)/n·S/B the same way (same rows,
same objective), for the side-by-side accuracy table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from fabricpace._errors import InputError, ParseError
from fabricpace.fabric.cluster import Cluster
from fabricpace.fabric.collectives import (
    OPS,
    LatencyParts,
    bus_factor,
    latency_parts,
    model_terms,
    protocol_bandwidth,
    selected_plan,
)
from fabricpace.fabric.nccl_tests import NcclTestsLog
from fabricpace.fabric.nccl_tests_layout import LayoutHint
from fabricpace.fabric.nccl_tests_runs import distinct_names, parse_logs, runs_notes

FITTED = ("net_efficiency", "tree_efficiency", "nvls_tree_efficiency", "base_us", "net_overhead_us")
# Below these fitted efficiencies the cluster file probably does not describe the logs' cluster: about
# half the lowest value any validation cluster gave (benchmarks/collective_accuracy.py), and that range.
_PLAUSIBLE_EFFICIENCY = {
    "net_efficiency": (0.45, "74-92% for rings"),
    "tree_efficiency": (0.2, "34-45% for trees"),
    "nvls_tree_efficiency": (0.3, "61-95% for NVLS-trees"),
}
_HIGH_RING_EFFICIENCY = 0.985
# Loss (squared log error) per calibration row that the other ring_floor form must save to be kept (about a
# 3.2% rms error). Chosen after the validation fits (audit 18): the overlapped floor saved 0.0018 and 0.0041
# per row on the two Alps (Slingshot) configurations, 0.00057 on the p5 fit of both collectives at once
# (which it would have moved from 10.4% / 46.9% to 13.0% / 36.6% on all-reduce), 0.00004 on Polaris
# all-gather, and nothing on the H100 IB and p5 headline fits (worse there).
RING_FLOOR_GAIN = 0.001


@dataclass(frozen=True)
class Points:
    """Measured points: op, nodes, GPUs per node, size (bytes) and time (s), one entry per row."""

    op: np.ndarray
    nodes: np.ndarray
    gpn: np.ndarray
    nbytes: np.ndarray
    time_s: np.ndarray

    def __len__(self) -> int:
        return int(self.nbytes.shape[0])


def points_from_logs(
    logs: Sequence[NcclTestsLog], *, min_bytes: int = 32 << 20, max_bytes: int = 8 << 30
) -> Points:
    """Rows of the logs inside [min_bytes, max_bytes] (out-of-place times)."""
    op, nodes, gpn, nb, ts = [], [], [], [], []
    for log in logs:
        if log.op is None:
            raise ParseError(
                f"{log.label}: cannot tell the collective; name the file after it (e.g. n4_all_reduce.log) "
                "or keep the '*_perf' command line in the log"
            )
        if log.op not in OPS:
            raise InputError(
                f"{log.label}: a {log.op} log, a collective the model does not have (it models "
                f"{', '.join(OPS)}); calibrate with logs of one of those"
            )
        if log.nodes is None:
            raise ParseError(
                f"{log.label}: no '#  Rank N ... on HOST' lines and no node count in the file name, so the "
                "node count is unknown; give the complete log (with its rank lines) or name the file after "
                "its node count (n4_all_reduce.log)"
            )
        if log.nranks is None or log.gpus_per_node is None:
            raise ParseError(
                f"{log.label}: no '#  Rank N ... on HOST' lines: {log.nodes} nodes from the file name, but "
                "GPUs per node are unknown; give them (collective --gpus-per-node, parse_log(hint=)) or the "
                "complete log"
            )
        for r in log.rows:
            if min_bytes <= r.size <= max_bytes and r.time_us > 0 and r.wrong == 0:  # wrong: not healthy
                op.append(log.op)
                nodes.append(log.nodes)
                gpn.append(log.gpus_per_node)
                nb.append(r.size)
                ts.append(r.time_us * 1e-6)
    if not nb:
        sizes = [r.size for log in logs for r in log.rows]
        span = f"their rows span {min(sizes)}..{max(sizes)} B" if sizes else "they have no rows"
        raise InputError(
            f"{', '.join(log.name for log in logs)}: no rows between {min_bytes} and {max_bytes} "
            f"bytes ({span}); the fit uses bandwidth-bound sizes: rerun nccl-tests with -b 32M -e 8G -f 2"
        )
    return Points(np.array(op), np.array(nodes), np.array(gpn), np.array(nb, dtype=float), np.array(ts))


def points_from_table(
    path: str | Path,
    op: str,
    *,
    gpus_per_node: int = 8,
    min_bytes: int = 32 << 20,
    max_bytes: int = 8 << 30,
) -> Points:
    """Points from a published table of nccl-tests results (CSV with the columns ``Nodes``, ``size(MB)``
    and ``out algbw(GB/s)``; sizes in MiB, as nccl-tests' ``-b 32M`` means). The time is S / algbw, which
    is how nccl-tests defines algbw, so only algbw's rounding (two decimals) is lost.
    Used for validation data that was published as a table rather than as raw logs."""
    import csv

    path = Path(path)
    try:
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh, skipinitialspace=True))
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from exc
    need = ("Nodes", "size(MB)", "out algbw(GB/s)")
    if not rows or any(k not in rows[0] for k in need):
        raise ParseError(f"{path}: expected a CSV with the columns {', '.join(need)}")
    nodes, nb, ts = [], [], []
    for line, r in enumerate(rows, start=2):
        try:
            n, size, algbw = int(r["Nodes"]), int(r["size(MB)"]) << 20, float(r["out algbw(GB/s)"])
        except (TypeError, ValueError) as exc:
            raise ParseError(f"{path}:{line}: not a number in Nodes, size(MB) or out algbw(GB/s)") from exc
        if min_bytes <= size <= max_bytes and algbw > 0:
            nodes.append(n)
            nb.append(size)
            ts.append(size / (algbw * 1e9))
    if not nb:
        raise InputError(f"{path}: no rows between {min_bytes} and {max_bytes} bytes")
    k = len(nb)
    return Points(
        np.full(k, op), np.array(nodes), np.full(k, gpus_per_node), np.array(nb, dtype=float), np.array(ts)
    )


def select(points: Points, mask: np.ndarray) -> Points:
    """The points where ``mask`` is true."""
    return Points(
        points.op[mask], points.nodes[mask], points.gpn[mask], points.nbytes[mask], points.time_s[mask]
    )


class FastModel:
    """The collective model of collectives.py evaluated for many points and many tunings at once.

    The selection does not depend on the fitted values (it is NCCL's estimate, ``selected_plan``), so
    every point's (algorithm, protocol) is fixed up front; per group of points with the same plan the
    bandwidth terms at unit efficiency and the latency terms are precomputed, and the time for a tuning is
    then a few vector operations. Tests check it equals ``collective_time`` exactly."""

    def __init__(self, cluster: Cluster, points: Points) -> None:
        self.points = points
        plans: dict[tuple[str, int, int, str, str], list[int]] = {}
        for i, (o, n, g, s) in enumerate(
            zip(points.op, points.nodes, points.gpn, points.nbytes, strict=True)
        ):
            alg, proto = selected_plan(cluster, str(o), float(s), int(n), int(g))
            plans.setdefault((str(o), int(n), int(g), alg, proto), []).append(i)
        self.groups: list[tuple[np.ndarray, str, str, float, float, float, LatencyParts]] = []
        for (op, n, g, alg, proto), rows in sorted(plans.items()):
            net, nvl, nvls = model_terms(cluster, op, n, g, alg)
            parts = latency_parts(cluster, op, alg, proto, n, g)
            self.groups.append((np.array(rows), alg, proto, net, nvl, nvls, parts))
        self.nvlink_efficiency = cluster.tuning.nvlink_efficiency
        # which fitted values any point depends on (a network term with that efficiency; a ring across nodes)
        self.uses = {
            "net_efficiency": any(g[3] > 0 and g[1] not in ("tree", "nvls_tree") for g in self.groups),
            "tree_efficiency": any(g[3] > 0 and g[1] == "tree" for g in self.groups),
            "nvls_tree_efficiency": any(g[3] > 0 and g[1] == "nvls_tree" for g in self.groups),
            "base_us": True,
            "net_overhead_us": any(g[6].overhead_mult > 0 for g in self.groups),
        }
        self.uses_overhead = self.uses["net_overhead_us"]

    def times(
        self,
        *,
        net_efficiency: float,
        tree_efficiency: float,
        nvls_tree_efficiency: float,
        base_us: float,
        net_overhead_us: float,
        ring_floor: str = "added",
    ) -> np.ndarray:
        out = np.empty(len(self.points))
        s = self.points.nbytes
        effs = {"tree": tree_efficiency, "nvls_tree": nvls_tree_efficiency}
        for rows, alg, proto, net, nvl, nvls, parts in self.groups:
            eff = effs.get(alg, net_efficiency)
            per_byte = max(net / eff, nvl / self.nvlink_efficiency, nvls)
            lat = parts.latency_us(base_us, net_overhead_us) * 1e-6
            data = s[rows] * per_byte / protocol_bandwidth(proto)
            floor = parts.floor_us(net_overhead_us) * 1e-6 if ring_floor == "overlapped" else 0.0
            out[rows] = lat - floor + np.maximum(data, floor)  # collectives._times
        return out


def nelder_mead(
    f: Callable[[np.ndarray], float], x0: np.ndarray, *, step: float = 0.5, iters: int = 400
) -> np.ndarray:
    """Minimise ``f`` from ``x0`` (standard Nelder-Mead: reflect, expand, contract, shrink)."""
    n = x0.shape[0]
    simplex = np.vstack([x0] + [x0 + step * np.eye(n)[i] for i in range(n)])
    values = np.array([f(x) for x in simplex])
    for _ in range(iters):
        order = np.argsort(values)
        simplex, values = simplex[order], values[order]
        if values[-1] - values[0] < 1e-12:
            break
        centroid = simplex[:-1].mean(axis=0)
        xr = centroid + (centroid - simplex[-1])
        fr = f(xr)
        if fr < values[0]:
            xe = centroid + 2.0 * (centroid - simplex[-1])
            fe = f(xe)
            simplex[-1], values[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(xc)
            if fc < values[-1]:
                simplex[-1], values[-1] = xc, fc
            else:
                simplex[1:] = simplex[0] + 0.5 * (simplex[1:] - simplex[0])
                values[1:] = [f(x) for x in simplex[1:]]
    return simplex[int(np.argmin(values))]


def _sigmoid(x: np.ndarray | float) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=float)))


@dataclass(frozen=True)
class Fit:
    """A calibration result: the calibrated cluster, the fitted values and the in-sample errors."""

    cluster: Cluster
    params: dict[str, float]
    n_points: int
    median_error_pct: float
    max_error_pct: float
    logs: tuple[str, ...]
    kept: tuple[str, ...] = ()  # parameters no calibration row depends on: the cluster's values stay
    node_counts: tuple[int, ...] = ()  # node counts of the calibration rows
    ops: tuple[str, ...] = ()  # collectives of the calibration rows
    gpus_per_node: tuple[int, ...] = ()  # GPUs per node of the calibration rows
    # what the logs' reading left out or assumed (NcclTestsLog.notes, logs not used); printed first
    input_notes: tuple[str, ...] = ()
    # the row with the largest in-sample error, signed (predicted / measured - 1, %), its nodes and size:
    # a fit's worst row is often a noisy or stepped measurement (an Alps 2-node 4 GiB row at 1.9x the
    # algbw of the 2 GiB row); the summary names it so the user can look at that row of the log
    worst_row: tuple[float, int, int] | None = None

    def notes(self, before: Cluster) -> list[str]:
        """Warnings about a fit that points at a cluster file which does not describe the logs' cluster.

        On the validation set (docs/cluster-files.md) fitted efficiencies were 0.74-0.92 for rings,
        0.34-0.45 for trees and 0.61-0.95 for NVLS-trees. One far below means the file's NICs (or NVLink)
        are faster than the logs' cluster's: the fit absorbed the difference there, and every term that
        does not scale with it is off by as much. A ring at the upper bound means the logs beat the file's
        line rate."""
        nics = f"{before.nics.count} x {before.nics.speed_gbps:g} Gb/s NICs per node"
        where = f"cluster {before.name!r} ({nics})"
        out = list(self.input_notes)
        for name, (low, usual) in _PLAUSIBLE_EFFICIENCY.items():
            eff = self.params.get(name)
            if name in self.kept or eff is None or eff >= low:
                continue
            out.append(
                f"note: fitted {name} {eff:.2f}: the logs reach {eff:.0%} of the rate {where} allows, "
                f"where real clusters reach {usual}; the file probably has more or faster NICs than the "
                "logs' cluster, and predictions from a cluster file that matches it are more reliable "
                "(docs/cluster-files.md)"
            )
        eff = self.params.get("net_efficiency")
        if "net_efficiency" not in self.kept and eff is not None and eff > _HIGH_RING_EFFICIENCY:
            out.append(
                f"note: fitted net_efficiency {eff:.2f}: these logs run at the line rate of {where} or "
                "faster; the file probably has fewer or slower NICs than the logs' cluster "
                "(docs/cluster-files.md)"
            )
        return out

    def summary(self) -> str:
        vals = ", ".join(f"{k}={v:.4g}" for k, v in self.params.items() if k not in self.kept)
        worst = f"worst {self.max_error_pct:.1f}%"
        if self.worst_row is not None:  # signed, and where, as --compare names its worst row
            err, nodes, size = self.worst_row
            worst = f"worst {err:+.1f}% ({_size_label(size)} on {nodes} node{'' if nodes == 1 else 's'})"
        out = (
            f"calibrated on {self.n_points} points from {len(self.logs)} "
            f"log{'' if len(self.logs) == 1 else 's'}: {vals}; "
            f"in-sample error median {self.median_error_pct:.1f}%, {worst}"
        )
        if self.cluster.tuning.ring_floor == "overlapped" and "net_overhead_us" not in self.kept:
            floor = 3 * self.params["net_overhead_us"]
            out += (
                f"; ring steps overlap their data with the proxy floor ({floor:.3g} us per Simple step; "
                "ring_floor: overlapped fits these rows better than added)"
            )
        if self.kept:
            out += f"; not constrained by these rows, kept from the cluster: {', '.join(self.kept)}"
        if self.node_counts == (1,):
            out += (
                "; every row is from 1 node, so no row crosses the network: the network terms keep the "
                "cluster file's values and predictions across nodes rest on them alone (add logs from 2 and "
                "4 nodes)"
            )
        elif len(self.node_counts) == 1:
            out += (
                f"; every row is from {self.node_counts[0]} nodes, so predictions at other node counts "
                "rest on the model's scaling alone (add logs from a second node count, e.g. 2 and 4)"
            )
        return out


def _size_label(n: int) -> str:
    """32M, 4G, 1536M, 48K or 100 (bytes), as nccl-tests' -b/-e options take them."""
    for shift, unit in ((30, "G"), (20, "M"), (10, "K")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def fit_tuning(cluster: Cluster, points: Points) -> tuple[dict[str, float], np.ndarray]:
    """Fitted ``FITTED`` values and the model's times on ``points``. Values no point depends on keep the
    cluster's value (``FastModel.uses``; ``unconstrained`` names them). Where rows run rings across nodes
    (the proxy floor is fitted), both ``ring_floor`` forms are fitted and the one with the smaller loss is
    kept (the cluster file's on a tie); the result's ``"ring_floor"`` is 1.0 for ``overlapped``."""
    model = FastModel(cluster, points)
    forms = [cluster.tuning.ring_floor]
    if model.uses["net_overhead_us"]:
        forms = sorted({"added", "overlapped"}, key=lambda f: f != cluster.tuning.ring_floor)
    best: tuple[float, dict[str, float], np.ndarray] | None = None
    for form in forms:
        values, loss, times = _fit_form(cluster, points, model, form)
        # the other form is a choice more: it must buy a measurable gain, not noise (RING_FLOOR_GAIN)
        if best is None or loss < best[0] - RING_FLOOR_GAIN * len(points):
            best = (loss, {**values, "ring_floor": 1.0 if form == "overlapped" else 0.0}, times)
    assert best is not None
    return best[1], best[2]


def _fit_form(
    cluster: Cluster, points: Points, model: FastModel, form: str
) -> tuple[dict[str, float], float, np.ndarray]:
    """``fit_tuning`` for one ``ring_floor`` form: the values, their loss and the model's times."""
    y = np.log(points.time_s)
    prior = {k: float(getattr(cluster.tuning, k)) for k in FITTED}
    free = [k for k in FITTED if model.uses[k]]
    efficiency = {"net_efficiency", "tree_efficiency", "nvls_tree_efficiency"}

    # transformed coordinates: logit for efficiencies (0..1), log for times
    def to_x(k: str, v: float) -> float:
        if k in efficiency:
            return float(np.log(v / (1 - min(v, 0.99))))
        return float(np.log(max(v, 1.0 if k == "base_us" else 0.1)))

    def unpack(x: np.ndarray) -> dict[str, float]:
        vals = dict(prior)
        for k, xi in zip(free, x, strict=True):
            vals[k] = float(_sigmoid(xi)) if k in efficiency else float(np.exp(xi))
        return vals

    def loss(x: np.ndarray) -> float:
        return float(np.sum((np.log(model.times(**unpack(x), ring_floor=form)) - y) ** 2))

    x0 = np.array([to_x(k, prior[k]) for k in free])
    best = x0
    best_loss = loss(x0)
    # more starts guard against flat regions: a larger fixed cost, a larger proxy overhead
    for moved in (None, "base_us", "net_overhead_us"):
        shift = np.array([2.0 if k == moved else 0.0 for k in free])
        x = nelder_mead(loss, x0 + shift, iters=800 + 200 * len(free))
        if loss(x) < best_loss:
            best, best_loss = x, loss(x)
    values = unpack(best)
    return values, best_loss, model.times(**values, ring_floor=form)


def calibrate_cluster(
    cluster: Cluster,
    logs: Sequence[str | Path | NcclTestsLog],
    *,
    min_bytes: int = 32 << 20,
    max_bytes: int = 8 << 30,
    op: str | None = None,
    hint: LayoutHint | None = None,
) -> Fit:
    """Fit ``cluster``'s tuning to nccl-tests logs; returns the calibrated cluster (source names the logs).

    Logs given as paths are parsed with ``hint`` (default: the cluster's GPUs per node) for a log that
    cannot tell its GPUs per node (a table without rank lines, an abridged list of ``device 0`` ranks;
    ``nccl_tests_layout``); the log's notes say what was assumed.

    With ``op`` (the collective to be predicted), logs of other collectives are left out when some log is of
    ``op``: one fit on two collectives is much worse than a fit on each (docs/cluster-files.md). A log
    given twice (the same file, or the same measurements under another name) counts once. Both are said
    in ``Fit.input_notes``, with each log's own notes (``NcclTestsLog.notes``). A file of several nccl-tests
    runs (a sweep's one output file) gives one log per run (``nccl_tests_runs``), each used as a file of
    its own would be; a note says which runs it holds."""
    if hint is None:
        source = f"the cluster file ({cluster.name!r})"
        hint = LayoutHint(gpus_per_node=cluster.gpus_per_node, source=source)
    parsed = [
        x for lg in logs for x in ([lg] if isinstance(lg, NcclTestsLog) else parse_logs(lg, hint=hint))
    ]
    if not parsed:
        raise InputError("--calibrate: give at least one nccl-tests log")
    parsed = distinct_names(parsed)  # per-job folders of one file name: the source names the folders
    runs = runs_notes(parsed)
    parsed, notes = _usable_logs(parsed, op)
    notes = runs + notes
    for lg in parsed:
        if lg.gpus_per_node is not None and lg.gpus_per_node > cluster.gpus_per_node:
            hosts = (
                f" (its {lg.nranks} ranks are on {len(lg.hosts)} host name(s): if several nodes share a host "
                "name, as containers can, the node count cannot be told)" if lg.hosts else ""
            )  # fmt: skip
            raise InputError(
                f"{lg.label}: {lg.gpus_per_node} GPUs per node, but cluster {cluster.name!r} has "
                f"{cluster.gpus_per_node}; use a matching cluster file{hosts}"
            )
        if lg.nodes is not None and lg.nodes > cluster.nodes:
            raise InputError(
                f"{lg.label}: {lg.nodes} nodes, more than cluster {cluster.name!r} has ({cluster.nodes})"
            )
        fitted = [r for r in lg.rows if min_bytes <= r.size <= max_bytes] or list(lg.rows)
        if fitted and all(r.wrong > 0 for r in fitted):
            trailer = f", 'Out of bounds values : {lg.out_of_bounds} FAILED'" if lg.out_of_bounds else ""
            raise InputError(
                f"{lg.label}: every row the fit would use reports wrong results (#wrong non-zero{trailer}): "
                "a bad GPU, NIC or link, whose timings cannot calibrate the cluster; fix it and give the log "
                "of a clean rerun"
            )
    points = points_from_logs(parsed, min_bytes=min_bytes, max_bytes=max_bytes)
    fit = calibrate_points(cluster, points, tuple(lg.name for lg in parsed))
    return replace(fit, input_notes=tuple(notes))


def _usable_logs(logs: list[NcclTestsLog], op: str | None) -> tuple[list[NcclTestsLog], list[str]]:
    """The logs to fit (duplicates and, when ``op`` is given and present, other collectives left out)
    and notes saying what was left out or assumed."""
    notes: list[str] = []
    kept: list[NcclTestsLog] = []
    seen: dict[tuple, str] = {}
    unmodelled = [lg for lg in logs if lg.op is not None and lg.op not in OPS]
    if unmodelled:
        if len(unmodelled) == len(logs):
            lg = unmodelled[0]
            raise InputError(
                f"{lg.label}: a {lg.op} log, a collective the model does not have (it models "
                f"{', '.join(OPS)}); calibrate with logs of one of those (all_reduce_perf, ...)"
            )
        notes.append(
            f"note: left out {', '.join(_with_op(lg) for lg in unmodelled)}: a collective the model does not "
            f"have (it models {', '.join(OPS)})"
        )
        logs = [lg for lg in logs if lg not in unmodelled]
    for lg in logs:
        key = (lg.op, lg.nodes, lg.nranks, lg.rows)
        if key in seen:
            notes.append(
                f"note: {lg.name}: the same measurements as {seen[key]}; counted once"
            )
            continue
        seen[key] = lg.name
        kept.append(lg)
    if op is not None and any(lg.op == op for lg in kept):
        other = [lg for lg in kept if lg.op not in (op, None)]
        if other:
            names = ", ".join(_with_op(lg) for lg in other)
            notes.append(
                f"note: left out {names}: predicting {op}, and a fit carries over poorly between collectives "
                f"(docs/cluster-files.md); give --op {other[0].op} to fit and predict that one"
            )
            kept = [lg for lg in kept if lg not in other]
    for lg in kept:
        notes += lg.notes()
    return kept, notes


def _with_op(lg: NcclTestsLog) -> str:
    """'n8.log (all_gather)'; 'sweep.log (run 2, lines 38-75: all_gather)' for one run of several."""
    if lg.run is None:
        return f"{lg.name} ({lg.op})"
    return f"{lg.file_name} (run {lg.run[0]}, lines {lg.run[1]}-{lg.run[2]}: {lg.op})"


def calibrate_points(cluster: Cluster, points: Points, names: Sequence[str]) -> Fit:
    """Fit ``cluster``'s tuning to measured points (``names``: where they came from, for ``source``)."""
    params, pred = fit_tuning(cluster, points)
    form = "overlapped" if params.pop("ring_floor", 0.0) else "added"
    signed = (pred / points.time_s - 1.0) * 100
    err = np.abs(signed)
    w = int(np.argmax(err))
    sizes = (int(points.nbytes.min()), int(points.nbytes.max()))
    calibrated = cluster.with_tuning(
        **params, ring_floor=form, source="fit:" + ",".join(names), calibrated_sizes=sizes
    )
    return Fit(
        calibrated, params, len(points), float(np.median(err)), float(err.max()), tuple(names),
        kept=unconstrained(cluster, points),
        node_counts=tuple(sorted({int(n) for n in points.nodes})),
        ops=tuple(sorted({str(o) for o in points.op})),
        gpus_per_node=tuple(sorted({int(g) for g in points.gpn})),
        worst_row=(float(signed[w]), int(points.nodes[w]), int(points.nbytes[w])),
    )


def unconstrained(cluster: Cluster, points: Points) -> tuple[str, ...]:
    """The fitted parameters that no point's predicted time depends on (e.g. the tree efficiency when
    every row ran as a ring)."""
    uses = FastModel(cluster, points).uses
    return tuple(k for k in FITTED if not uses[k])


# ---- the plain alpha-beta ring baseline ----------------------------------------------------------------
def alpha_beta_fit(points: Points) -> tuple[float, float]:
    """(alpha seconds per step, B bytes/s) of T = 2(n-1)·alpha + 2(n-1)/n·S/B (n = ranks; for all-gather
    (n-1) steps and (n-1)/n), least squares on relative error, same rows as the model's fit."""
    x = _alpha_beta_design(points)
    w = 1.0 / points.time_s
    coef, *_ = np.linalg.lstsq(x * w[:, None], points.time_s * w, rcond=None)
    alpha, inv_b = float(coef[0]), float(coef[1])
    if inv_b <= 0:
        raise InputError("alpha-beta fit failed: no bandwidth term in the calibration rows")
    return alpha, 1.0 / inv_b


def alpha_beta_predict(points: Points, alpha: float, bandwidth: float) -> np.ndarray:
    """Times (s) of the alpha-beta ring for ``points``."""
    return _alpha_beta_design(points) @ np.array([alpha, 1.0 / bandwidth])


def _alpha_beta_design(points: Points) -> np.ndarray:
    n = (points.nodes * points.gpn).astype(float)
    ar = points.op == "all_reduce"
    steps = np.where(ar, 2 * (n - 1), n - 1)
    factor = np.array([bus_factor(str(o), int(k)) for o, k in zip(points.op, n, strict=True)])
    return np.stack([steps, factor * points.nbytes], axis=1)
