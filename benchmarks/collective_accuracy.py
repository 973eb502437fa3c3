"""Prediction accuracy of the collective model on real nccl-tests measurements, side by side with a plain
alpha-beta ring fitted the same way.

Validation set (tests/fabric/data, see its README for every source):

* ``h100-ib``: one 8-node H100 / 8x400 Gb/s InfiniBand cluster, all_reduce_perf at 2, 4 and 8 nodes
  (raw nccl-tests logs, NVIDIA/nccl-tests issue #309).
* ``p5-efa``: one AWS p5.48xlarge (H100, 32x100 Gb/s EFA) SageMaker HyperPod cluster, all_reduce_perf at
  2..32 nodes (32 MiB..8 GiB), all_gather_perf and alltoall_perf at 2..32 nodes (32 MiB..2 GiB): the
  author's tables of nccl-tests results (crazyguitar/aws-gpu-communication-benchmark and its earlier copy
  crazyguitar/gpu-communication-benchmark). all_to_all is scored the same way as the other two; it is
  outside the issue's target (all_reduce and all_gather), and is shown as a check of a third collective.

Held out, the issue's protocol on a fourth cluster (printed after the headline table, not in its "every
cluster" lines): ``alps``, CSCS Alps (4x GH200 per node, 4x Slingshot 11), all_reduce_perf tables of one
campaign (boeschf/nccl-benchmark-on-alps-2025): fitted on 2+4 nodes, predicting 8 (run_0001), 16 and 32
(run_0000); run_0000's degraded 8-node job is scored on its own line. No all_gather runs exist there.

Secondary check, another protocol (printed after the headline table): ``polaris``, ALCF Polaris (4x A100
per node, 2x Slingshot 11), all_reduce_perf and all_gather_perf at 2, 8, 256 and 540 nodes (argonne-lcf/
alcf-nccl-tests; no 4-node run exists): fitted on 2+8 nodes predicting 256 and 540, and on 2 nodes
predicting 8.

Protocol: for each cluster and collective, the model and the alpha-beta ring are fitted on that
collective's 2- and 4-node rows only (least squares on log time) and predict every larger node count;
nothing is fitted to the predicted rows. Also printed, for transparency: the p5 fit on both collectives'
2- and 4-node rows at once, p5 all-reduce with NCCL's own algorithm choice instead of AWS's tuner plugin
(which the measured run used), and the closest preset without any calibration.

Also printed: the measured slope and intercept of the NVLS-tree rows per node count beside the fit (why
NVLS-tree at 16/32 nodes misses, docs/cluster-files.md), and the same rows grouped by NCCL's NVLS_TREE chunk
size.

Run: ``.venv/bin/python benchmarks/collective_accuracy.py`` (a few seconds).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fabricpace.fabric import Cluster, collective_time, load_cluster
from fabricpace.fabric.calibrate import (
    Points,
    alpha_beta_fit,
    alpha_beta_predict,
    calibrate_points,
    points_from_logs,
    points_from_table,
    select,
)
from fabricpace.fabric.nccl_tests import parse_log
from fabricpace.fabric.nccl_tests_layout import LayoutHint

DATA = Path(__file__).resolve().parent.parent / "tests" / "fabric" / "data"
CALIBRATION_NODES = (2, 4)


@dataclass(frozen=True)
class Dataset:
    """Measurements of one cluster at several node counts (one or more collectives) and its preset."""

    name: str
    preset: str
    points: Points
    source: str


def _concat(*parts: Points) -> Points:
    return Points(*(np.concatenate([getattr(p, f) for p in parts]) for f in Points.__dataclass_fields__))


def datasets() -> list[Dataset]:
    """The validation set (tests/fabric/data)."""
    h100 = points_from_logs([parse_log(DATA / f"h100ib_n{n}_all_reduce.log") for n in (2, 4, 8)])
    p5 = _concat(
        points_from_table(DATA / "p5efa_all_reduce_table.csv", "all_reduce"),
        points_from_table(DATA / "p5efa_all_gather_table.csv", "all_gather"),
        points_from_table(DATA / "p5efa_alltoall_table.csv", "all_to_all"),
    )
    return [
        Dataset("h100-ib", "dgx-h100-ib", h100, "NVIDIA/nccl-tests#309 logs"),
        Dataset("p5-efa", "p5-efa", p5, "crazyguitar/(aws-)gpu-communication-benchmark tables"),
    ]


def alps_dataset() -> tuple[Dataset, Points]:
    """CSCS Alps: the 2/4-node tables and the held-out 8 (run_0001), 16 and 32-node tables; and run_0000's
    degraded 8-node table apart (tests/fabric/data/README.md). The tables have no rank lines: 4 GPUs per
    node, as the campaign ran (one rank per GH200)."""
    hint = LayoutHint(gpus_per_node=4, source="benchmark")
    names = ("_n2", "_n4", "r1_n8", "_n16", "_n32")
    logs = [parse_log(DATA / f"alpscfg2{n}_all_reduce.txt", hint=hint) for n in names]
    degraded = points_from_logs([parse_log(DATA / "alpscfg2_n8_all_reduce.txt", hint=hint)])
    source = "boeschf/nccl-benchmark-on-alps-2025"
    ds = Dataset("alps", str(DATA / "alps.yaml"), points_from_logs(logs), source)
    return ds, degraded


def alps_compat0_dataset() -> Dataset:
    """The campaign's other configuration (FI_CXI_COMPAT_0): 2-node table, the raw 4-node Slurm output and
    the 8- and 16-node tables (rows with #wrong are left out); its 32-node job is degraded and not used."""
    hint = LayoutHint(gpus_per_node=4, source="benchmark")
    files = ["alpscompat0_n2_all_reduce.txt", "alps_n4_all_reduce.out", "alpscompat0_n8_all_reduce.txt",
             "alpscompat0_n16_all_reduce.txt"]
    logs = [parse_log(DATA / f, hint=hint) for f in files]
    return Dataset("alps-c0", str(DATA / "alps.yaml"), points_from_logs(logs), "the same campaign")


POLARIS_PROTOCOLS = ((2, 8), (2,))  # no 4-node run: fit 2+8 -> 256, 540; fit 2 -> 8 (and beyond)


def secondary_datasets() -> list[Dataset]:
    """Clusters without 2- and 4-node runs, scored with another protocol (POLARIS_PROTOCOLS)."""
    logs = [
        parse_log(DATA / f"polaris_n{n}_{op}.log")
        for op in ("all_reduce", "all_gather")
        for n in (2, 8, 256, 540)
    ]
    source = "argonne-lcf/alcf-nccl-tests logs"
    return [Dataset("polaris", str(DATA / "polaris.yaml"), points_from_logs(logs), source)]


@dataclass(frozen=True)
class Scored:
    """Per predicted row of one (cluster, collective): nodes, size, measured and predicted times (s)."""

    dataset: str
    op: str
    nodes: np.ndarray
    nbytes: np.ndarray
    measured: np.ndarray
    model: np.ndarray
    plan: list[str]
    alpha_beta: np.ndarray

    def errors(self, which: str) -> np.ndarray:
        return (getattr(self, which) / self.measured - 1.0) * 100.0


def predict(cluster: Cluster, test: Points) -> tuple[np.ndarray, list[str]]:
    """The model's times and plans for the points of ``test``."""
    res = [
        collective_time(cluster, str(o), s, nodes=int(n))
        for o, s, n in zip(test.op, test.nbytes, test.nodes, strict=True)
    ]
    return np.array([r.time_s for r in res]), [f"{r.algorithm}/{r.protocol}" for r in res]


def split(
    points: Points, op: str | None = None, cal_nodes: tuple[int, ...] = CALIBRATION_NODES
) -> tuple[Points, Points]:
    """(calibration rows, predicted rows), of one collective or of all."""
    mine = np.ones(len(points), bool) if op is None else points.op == op
    cal = np.isin(points.nodes, cal_nodes)
    return select(points, mine & cal), select(points, mine & ~cal)


def evaluate(
    ds: Dataset, op: str, cluster: Cluster | None = None, cal_nodes: tuple[int, ...] = CALIBRATION_NODES
) -> tuple[Scored, str]:
    """Fit ``op``'s calibration rows, predict its larger node counts; the scores and the fit summary."""
    cal, test = split(ds.points, op, cal_nodes)
    fit = calibrate_points(cluster or load_cluster(ds.preset), cal, [f"{ds.name}:{op}"])
    alpha, bw = alpha_beta_fit(cal)
    model, plan = predict(fit.cluster, test)
    scored = Scored(
        ds.name, op, test.nodes, test.nbytes, test.time_s, model, plan, alpha_beta_predict(test, alpha, bw)
    )
    summary = (
        f"{ds.name} {op} ({ds.source}): {fit.summary()}\n"
        f"  alpha-beta ring fit on the same rows: alpha={alpha * 1e6:.2f} us/step, B={bw / 1e9:.1f} GB/s"
    )
    return scored, summary


def stats(err: np.ndarray) -> str:
    """Median and worst |error| of a set of errors in percent."""
    a = np.abs(err)
    return f"median |error| {np.median(a):5.1f}%, worst {a.max():6.1f}%  (n={a.size})"


def _table(scores: list[Scored]) -> None:
    head = (
        "cluster",
        "op",
        "nodes",
        "size",
        "measured us",
        "model us",
        "algo/proto",
        "err %",
        "a-b us",
        "err %",
    )
    widths = (8, 10, 5, 6, 12, 10, 16, 7, 10, 7)
    print(" ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)))
    for sc in scores:
        em, ea = sc.errors("model"), sc.errors("alpha_beta")
        for i in range(sc.nodes.size):
            print(
                f"{sc.dataset:>8} {sc.op:>10} {int(sc.nodes[i]):>5} {int(sc.nbytes[i]) >> 20:>5}M "
                f"{sc.measured[i] * 1e6:>12.1f} {sc.model[i] * 1e6:>10.1f} {sc.plan[i]:>16} {em[i]:>+7.1f} "
                f"{sc.alpha_beta[i] * 1e6:>10.1f} {ea[i]:>+7.1f}"
            )


def nvls_tree_slopes(ds: Dataset, fit_cluster: Cluster) -> list[str]:
    """Measured incremental bandwidth of the NVLS-tree rows (consecutive sizes the plan keeps, same node
    count), beside what the calibrated model uses: ``nvls_tree_efficiency`` x line rate per node traffic,
    and the ring's ``net_efficiency`` in its place. Only measured rows and the fit are used (a diagnostic)."""
    pts = select(ds.points, ds.points.op == "all_reduce")
    plans = [
        collective_time(fit_cluster, "all_reduce", s, nodes=int(n))
        for s, n in zip(pts.nbytes, pts.nodes, strict=True)
    ]
    tu = fit_cluster.tuning
    line = fit_cluster.node_net_bytes_per_s / 1e9
    out = []
    for n in np.unique(pts.nodes):
        rows = [i for i in np.flatnonzero(pts.nodes == n) if plans[i].algorithm == "nvls_tree"]
        if len(rows) < 2:
            continue
        i, j = rows[0], rows[-1]
        slope = (pts.nbytes[j] - pts.nbytes[i]) / (pts.time_s[j] - pts.time_s[i]) / 1e9
        intercept = (pts.time_s[i] - pts.nbytes[i] / (slope * 1e9)) * 1e6
        per_node = 1.0 if n <= 2 else 0.5  # network bytes per node: S on 2 nodes, 2S from 4 (bwInter/2)
        out.append(
            f"  {ds.name} {int(n):>2} nodes, {int(pts.nbytes[i]) >> 20}M..{int(pts.nbytes[j]) >> 20}M: "
            "measured "
            f"{slope:6.1f} GB/s per extra byte (intercept {intercept:7.1f} us); line rate x per-node share x "
            f"nvls_tree_efficiency {line * per_node * tu.nvls_tree_efficiency:6.1f}, x net_efficiency "
            f"{line * per_node * tu.net_efficiency:6.1f}; model latency {plans[i].latency_s * 1e6:6.1f} us"
        )
    return out


# NCCL's NVLS_TREE chunk (calcCollChunking in src/enqueue.cc, NCCL 2.23+): NCCL_NVLS_CHUNKSIZE (128 KiB)
# capped by NCCL_NVLSTREE_MAX_CHUNKSIZE (unset: 64 KiB from 4 nodes), then cut to 256/128/64/32 KiB below
# 32/16/4/1 x concurrentOps x chunk; concurrentOps = NVLS channels (16 on H100) x heads (8 with 8 NICs).
# AWS's plugin sets both sizes to 512 KiB on p5 (tests/fabric/data/README.md).
NVLS_TREE_CONCURRENT_OPS = 16 * 8


def nvls_tree_chunk(nbytes: float, nodes: int, plugin_chunk: int | None) -> int:
    """NCCL's NVLS_TREE chunk size (bytes) for one all-reduce of ``nbytes`` (see above)."""
    chunk = plugin_chunk or 128 << 10
    chunk = min(chunk, plugin_chunk or (64 << 10 if nodes >= 4 else chunk))
    for mult, floor in ((32, 256 << 10), (16, 128 << 10), (4, 64 << 10), (1, 32 << 10)):
        if nbytes < mult * NVLS_TREE_CONCURRENT_OPS * chunk and chunk > floor:
            chunk = floor
    return chunk


def nvls_tree_chunk_regimes(ds: Dataset, fit_cluster: Cluster) -> list[str]:
    """The NVLS-tree rows of each node count grouped by NCCL's chunk: least-squares slope and intercept per
    group, and from 4 nodes the intercept of each row at the ring's NIC rate (a diagnostic of measured rows;
    docs/cluster-files.md, audit 20)."""
    pts = select(ds.points, ds.points.op == "all_reduce")
    plugin_chunk = 512 << 10 if fit_cluster.tuning.tuner == "aws-ofi-p5" else None
    algos = [
        collective_time(fit_cluster, "all_reduce", s, nodes=int(n)).algorithm
        for s, n in zip(pts.nbytes, pts.nodes, strict=True)
    ]
    ring_rate = fit_cluster.node_net_bytes_per_s * 0.5 * fit_cluster.tuning.net_efficiency  # 2S per node
    out = []
    for n in np.unique(pts.nodes):
        rows = [i for i in np.flatnonzero(pts.nodes == n) if algos[i] == "nvls_tree"]
        chunks = {i: nvls_tree_chunk(float(pts.nbytes[i]), int(n), plugin_chunk) for i in rows}
        for c in sorted(set(chunks.values())):
            idx = [i for i in rows if chunks[i] == c]
            sizes = ", ".join(f"{int(pts.nbytes[i]) >> 20}M" for i in idx)
            parts = []
            if len(idx) >= 2:
                a = np.stack([np.ones(len(idx)), pts.nbytes[idx]], axis=1)
                (icpt, per_byte), *_ = np.linalg.lstsq(a, pts.time_s[idx], rcond=None)
                parts.append(f"{1 / per_byte / 1e9:.1f} GB/s, intercept {icpt * 1e6:.0f} us")
            if n > 2:
                at_ring = ", ".join(f"{(pts.time_s[i] - pts.nbytes[i] / ring_rate) * 1e6:.0f}" for i in idx)
                parts.append(f"intercept at the ring's NIC rate ({ring_rate / 1e9:.1f} GB/s) {at_ring} us")
            what = "; ".join(parts) or "one row"
            out.append(f"  {ds.name} {int(n):>2} nodes, chunk {c >> 10:>3}K ({sizes}): {what}")
    return out


def main() -> None:
    # No options: --help prints what it measures instead of running it.
    fmt = argparse.RawDescriptionHelpFormatter
    argparse.ArgumentParser(description=__doc__, formatter_class=fmt).parse_args()
    sets = datasets()
    scores: list[Scored] = []
    for ds in sets:
        for op in sorted(set(ds.points.op.tolist())):
            scored, summary = evaluate(ds, op)
            print(summary)
            scores.append(scored)
    print("\npredicted from the 2- and 4-node rows of the same cluster and collective:")
    _table(scores)
    print("\nsummary (predicted rows only; target: median <= 5%, worst <= 25%)")
    for sc in scores:
        for n in np.unique(sc.nodes):
            m = sc.nodes == n
            print(
                f"  {sc.dataset:>8} {sc.op:>10} {int(n):>2} nodes  model:      {stats(sc.errors('model')[m])}"
            )
            print(f"  {'':>8} {'':>10} {'':>8}  alpha-beta: {stats(sc.errors('alpha_beta')[m])}")
        print(f"  {sc.dataset:>8} {sc.op:>10} all nodes  model:      {stats(sc.errors('model'))}")
        print(f"  {'':>8} {'':>10} {'':>8}  alpha-beta: {stats(sc.errors('alpha_beta'))}")
    for op in ("all_reduce", "all_gather", "all_to_all"):
        mine = [sc for sc in scores if sc.op == op]
        for which in ("model", "alpha_beta"):
            err = np.concatenate([sc.errors(which) for sc in mine])
            print(f"  every cluster {op:>10} {which + ':':<11} {stats(err)}")

    print("\nheld out, the issue's protocol on a fourth cluster (all_reduce only; not in the lines above):")
    alps, degraded = alps_dataset()
    sc, summary = evaluate(alps, "all_reduce")
    print(f"  {summary.splitlines()[0]}")
    for n in np.unique(sc.nodes):
        m = sc.nodes == n
        print(
            f"    {int(n):>3} nodes  model: {stats(sc.errors('model')[m])}   "
            f"alpha-beta: {stats(sc.errors('alpha_beta')[m])}"
        )
    print(f"    all      model: {stats(sc.errors('model'))}   alpha-beta: {stats(sc.errors('alpha_beta'))}")
    big = sc.nbytes >= 512 << 20
    print(f"    512M-4G  model: {stats(sc.errors('model')[big])}")
    fit = calibrate_points(load_cluster(alps.preset), split(alps.points, "all_reduce")[0], ["alps"])
    bad, _ = predict(fit.cluster, degraded)
    print(
        "      8 nodes, run_0000 (degraded job: 9x slower at 32M than run_0001): model: "
        f"{stats((bad / degraded.time_s - 1) * 100)}"
    )
    # set after seeing these rows: NCCL's LL128 rule for a NIC behind the CPU (docs/cluster-files.md)
    no_ll128 = load_cluster(alps.preset).with_tuning(ll128_across_nodes=False)
    for ds in (alps, alps_compat0_dataset()):
        variants = ((None, "as written"), (no_ll128, "ll128_across_nodes: false (set after seeing)"))
        for cluster, how in variants:
            if ds is alps and cluster is None:
                continue  # printed above
            sc2, summary2 = evaluate(ds, "all_reduce", cluster)
            print(f"  {ds.name}, {how}: {summary2.splitlines()[0].split(': ', 1)[1]}")
            for n in np.unique(sc2.nodes):
                m = sc2.nodes == n
                print(f"    {int(n):>3} nodes  model: {stats(sc2.errors('model')[m])}")
            print(f"    all      model: {stats(sc2.errors('model'))}")

    print("\nsecondary check, another protocol (no 4-node run on this cluster; not the issue's protocol):")
    for ds in secondary_datasets():
        for cal_nodes in POLARIS_PROTOCOLS:
            for op in ("all_reduce", "all_gather"):
                sc, summary = evaluate(ds, op, cal_nodes=cal_nodes)
                fitted = "+".join(str(n) for n in cal_nodes)
                fit_line = summary.splitlines()[0].split(": ", 1)[1]
                print(f"  {ds.name} {op}, fitted on {fitted} nodes: {fit_line}")
                for n in np.unique(sc.nodes):
                    m = sc.nodes == n
                    print(
                        f"    {int(n):>3} nodes  model: {stats(sc.errors('model')[m])}   "
                        f"alpha-beta: {stats(sc.errors('alpha_beta')[m])}"
                    )

    print("\nfor transparency (not the headline protocol):")
    p5 = next(ds for ds in sets if ds.name == "p5-efa")
    both = select(p5.points, np.isin(p5.points.op, ("all_reduce", "all_gather")))
    cal, test = split(both)
    joint = calibrate_points(load_cluster(p5.preset), cal, ["p5:both"])
    model, _ = predict(joint.cluster, test)
    print(f"  p5-efa, one fit on both collectives' 2+4-node rows: {joint.summary()}")
    for op in ("all_reduce", "all_gather"):
        m = test.op == op
        print(f"    {op:>10}: {stats((model[m] / test.time_s[m] - 1) * 100)}")
    nccl_choice, _ = evaluate(p5, "all_reduce", load_cluster(p5.preset).with_tuning(tuner="nccl"))
    print(
        "  p5-efa all_reduce with NCCL's own choice instead of AWS's tuner plugin (the run used the plugin):"
        f" {stats(nccl_choice.errors('model'))}"
    )
    for ds in sets:
        for op in sorted(set(ds.points.op.tolist())):
            _, test = split(ds.points, op)
            raw, _ = predict(load_cluster(ds.preset), test)
            print(f"  {ds.name} {op}, preset without calibration: {stats((raw / test.time_s - 1) * 100)}")

    print("\nNVLS-tree rows: measured slope, smallest to largest size per node count (all-reduce fits):")
    for ds in sets:
        cal, _ = split(ds.points, "all_reduce")
        for line in nvls_tree_slopes(ds, calibrate_points(load_cluster(ds.preset), cal, ["x"]).cluster):
            print(line)

    print("\nNVLS-tree rows by NCCL's NVLS_TREE chunk (16 channels x 8 heads; p5: the plugin's 512 KiB):")
    for ds in sets:
        cal, _ = split(ds.points, "all_reduce")
        chunk_fit = calibrate_points(load_cluster(ds.preset), cal, ["x"]).cluster
        for line in nvls_tree_chunk_regimes(ds, chunk_fit):
            print(line)

    h100 = sets[0]
    fit = calibrate_points(load_cluster(h100.preset), split(h100.points, "all_reduce")[0], ["h100"])
    print("\nh100-ib (all-reduce fit): unscored predictions (no measurements at these scales), busbw GB/s:")
    for op in ("all_reduce", "all_gather"):
        for nodes in (16, 32):
            row = [collective_time(fit.cluster, op, s, nodes=nodes) for s in (32 << 20, 1 << 30, 8 << 30)]
            print(
                f"  {op} {nodes} nodes: "
                + ", ".join(f"{r.nbytes >> 20}M {r.busbw_gbps:.0f} ({r.algorithm}/{r.protocol})" for r in row)
            )


if __name__ == "__main__":
    main()
