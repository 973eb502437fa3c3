"""Prediction accuracy of the collective model on real nccl-tests measurements, side by side with a plain
alpha-beta ring fitted the same way.

Validation set (tests/fabric/data, see its README for every source):

* ``h100-ib``: one 8-node H100 / 8x400 Gb/s InfiniBand cluster, all_reduce_perf at 2, 4 and 8 nodes
  (raw nccl-tests logs, NVIDIA/nccl-tests issue #309).
* ``p5-efa``: one AWS p5.48xlarge (H100, 32x100 Gb/s EFA) SageMaker HyperPod cluster, all_reduce_perf at
  2, 4, 8, 16 and 32 nodes (the author's table of nccl-tests results, crazyguitar/aws-gpu-communication-
  benchmark, data/nccl_all_reduce.csv).

For each cluster both models are fitted on the 2- and 4-node rows only (32 MiB..8 GiB, least squares on
log time) and predict every larger node count; nothing is fitted to the predicted rows. The closest
preset without any calibration is scored too, as a separate line. No multi-node all_gather_perf
measurements of one cluster at several node counts were found, so all_gather is not scored; the script
says so instead of inventing numbers.

Run: ``.venv/bin/python benchmarks/collective_accuracy.py`` (a few seconds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fabricpace.fabric import collective_time, load_cluster
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

DATA = Path(__file__).resolve().parent.parent / "tests" / "fabric" / "data"
CALIBRATION_NODES = (2, 4)


@dataclass(frozen=True)
class Dataset:
    """Measurements of one cluster at several node counts, and the preset that describes it."""

    name: str
    preset: str
    op: str
    load: Callable[[], Points]
    source: str
    calibration_files: tuple[str, ...]


def _h100_ib() -> Points:
    return points_from_logs([parse_log(DATA / f"h100ib_n{n}_all_reduce.log") for n in (2, 4, 8)])


def _p5_efa() -> Points:
    return points_from_table(DATA / "p5efa_all_reduce_table.csv", "all_reduce")


DATASETS = (
    Dataset(
        "h100-ib",
        "dgx-h100-ib",
        "all_reduce",
        _h100_ib,
        "NVIDIA/nccl-tests#309 logs",
        ("h100ib_n2_all_reduce.log", "h100ib_n4_all_reduce.log"),
    ),
    Dataset(
        "p5-efa",
        "p5-efa",
        "all_reduce",
        _p5_efa,
        "crazyguitar/aws-gpu-communication-benchmark",
        ("p5efa_all_reduce_table.csv[nodes=2,4]",),
    ),
)


@dataclass(frozen=True)
class Scored:
    """Per predicted row: nodes, size, measured and predicted times (s), the model's plan, a-b time."""

    dataset: str
    op: str
    nodes: np.ndarray
    nbytes: np.ndarray
    measured: np.ndarray
    model: np.ndarray
    plan: list[str]
    alpha_beta: np.ndarray
    uncalibrated: np.ndarray

    def errors(self, which: str) -> np.ndarray:
        return (getattr(self, which) / self.measured - 1.0) * 100.0


def evaluate(ds: Dataset) -> tuple[Scored, str]:
    """Fit on the calibration node counts, predict the rest; returns the scores and the fit summary."""
    pts = ds.load()
    cal_mask = np.isin(pts.nodes, CALIBRATION_NODES)
    cal, test = select(pts, cal_mask), select(pts, ~cal_mask)
    preset = load_cluster(ds.preset)
    fit = calibrate_points(preset, cal, ds.calibration_files)
    alpha, bw = alpha_beta_fit(cal)
    results = [
        collective_time(fit.cluster, str(o), s, nodes=int(n))
        for o, s, n in zip(test.op, test.nbytes, test.nodes, strict=True)
    ]
    raw = [
        collective_time(preset, str(o), s, nodes=int(n)).time_s
        for o, s, n in zip(test.op, test.nbytes, test.nodes, strict=True)
    ]
    scored = Scored(
        ds.name,
        ds.op,
        test.nodes,
        test.nbytes,
        test.time_s,
        np.array([r.time_s for r in results]),
        [f"{r.algorithm}/{r.protocol}" for r in results],
        alpha_beta_predict(test, alpha, bw),
        np.array(raw),
    )
    summary = (
        f"{ds.name} ({ds.source}), preset {ds.preset}: {fit.summary()}\n"
        f"  alpha-beta ring fit on the same rows: alpha={alpha * 1e6:.2f} us/step, B={bw / 1e9:.1f} GB/s"
    )
    return scored, summary


def _stats(err: np.ndarray) -> str:
    a = np.abs(err)
    return f"median |error| {np.median(a):5.1f}%, worst {a.max():6.1f}%  (n={a.size})"


def main() -> None:
    scores = []
    for ds in DATASETS:
        scored, summary = evaluate(ds)
        print(summary)
        scores.append(scored)
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
    widths = (8, 10, 5, 6, 12, 10, 12, 7, 10, 7)
    print("\npredicted from the 2- and 4-node rows of the same cluster:")
    print(" ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)))
    for sc in scores:
        em, ea = sc.errors("model"), sc.errors("alpha_beta")
        for i in range(sc.nodes.size):
            print(
                f"{sc.dataset:>8} {sc.op:>10} {int(sc.nodes[i]):>5} {int(sc.nbytes[i]) >> 20:>5}M "
                f"{sc.measured[i] * 1e6:>12.1f} {sc.model[i] * 1e6:>10.1f} {sc.plan[i]:>12} {em[i]:>+7.1f} "
                f"{sc.alpha_beta[i] * 1e6:>10.1f} {ea[i]:>+7.1f}"
            )
    print("\nsummary (predicted rows only; target: median <= 5%, worst <= 25%)")
    for sc in scores:
        for n in np.unique(sc.nodes):
            m = sc.nodes == n
            print(f"  {sc.dataset:>8} {sc.op} {int(n):>2} nodes  model:      {_stats(sc.errors('model')[m])}")
            print(f"  {'':>8} {'':>10} {'':>8}  alpha-beta: {_stats(sc.errors('alpha_beta')[m])}")
        print(f"  {sc.dataset:>8} {sc.op} all nodes  model:      {_stats(sc.errors('model'))}")
        print(f"  {'':>8} {'':>10} {'':>8}  alpha-beta: {_stats(sc.errors('alpha_beta'))}")
        print(f"  {'':>8} {'':>10} {'':>8}  preset, uncalibrated: {_stats(sc.errors('uncalibrated'))}")
    every = {w: np.concatenate([sc.errors(w) for sc in scores]) for w in ("model", "alpha_beta")}
    print(f"  all clusters            model:      {_stats(every['model'])}")
    print(f"  {'':>24}alpha-beta: {_stats(every['alpha_beta'])}")
    print("all_gather: no multi-node all_gather_perf measurements of one cluster at several node counts were")
    print("found -> not scored")
    h100 = next(ds for ds in DATASETS if ds.name == "h100-ib")
    fit = calibrate_points(
        load_cluster(h100.preset), select(h100.load(), np.isin(h100.load().nodes, (2, 4))), ["h"]
    )
    print("\nh100-ib: unscored predictions (no measurements at these scales), busbw GB/s:")
    for nodes in (16, 32):
        row = [
            collective_time(fit.cluster, "all_reduce", s, nodes=nodes) for s in (32 << 20, 1 << 30, 8 << 30)
        ]
        print(
            f"  {nodes} nodes: "
            + ", ".join(f"{r.nbytes >> 20}M {r.busbw_gbps:.0f} ({r.algorithm})" for r in row)
        )


if __name__ == "__main__":
    main()
