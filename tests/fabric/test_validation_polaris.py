"""A cluster without 2- and 4-node runs, scored with another protocol: ALCF Polaris (data/README.md,
``polaris_*.log`` and ``polaris.yaml``): all_reduce_perf and all_gather_perf of NCCL 2.21.5 at 2, 8, 256 and
540 nodes of 4 A100. Fitted on 2+8 nodes predicting 256 and 540, and on 2 nodes predicting 8. The bounds
record what the model reaches (docs/cluster-files.md, 'Accuracy'), so a change that makes it worse fails."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fabricpace.fabric import collective_time, load_cluster
from fabricpace.fabric.calibrate import (
    Points,
    alpha_beta_fit,
    alpha_beta_predict,
    calibrate_points,
    points_from_logs,
    select,
)
from fabricpace.fabric.nccl_tests import parse_log

DATA = Path(__file__).parent / "data"
NODES = (2, 8, 256, 540)


@pytest.mark.parametrize("op", ["all_reduce", "all_gather"])
@pytest.mark.parametrize("nodes", NODES)
def test_polaris_log_loads_with_its_node_count_and_sizes(op, nodes):
    log = parse_log(DATA / f"polaris_n{nodes}_{op}.log")
    # 256/540: the copies keep only a few rank lines (README); nodes = ranks / GPUs per node then
    assert (log.op, log.nodes, log.nranks, log.gpus_per_node) == (op, nodes, 4 * nodes, 4)
    assert len(log.rows) == 29 and log.sizes().max() <= 1 << 30
    if op == "all_reduce":
        assert log.sizes()[0] == 4 and log.sizes()[-1] == 1 << 30
    big = log.rows[-1]  # the published busbw is algbw x the bus factor of 4 x nodes ranks
    n = 4 * nodes
    factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
    assert big.busbw == pytest.approx(big.size / big.time_us / 1e3 * factor, abs=0.02)


@pytest.fixture(scope="module")
def points() -> dict[str, Points]:
    return {
        op: points_from_logs([parse_log(DATA / f"polaris_n{n}_{op}.log") for n in NODES])
        for op in ("all_reduce", "all_gather")
    }


def _errors(points: Points, op: str, cal_nodes: tuple[int, ...]) -> tuple[Points, np.ndarray, np.ndarray]:
    """(predicted rows, model |error|, alpha-beta |error|) of a fit on ``cal_nodes``."""
    cal_mask = np.isin(points.nodes, cal_nodes)
    cal, test = select(points, cal_mask), select(points, ~cal_mask)
    fit = calibrate_points(load_cluster(DATA / "polaris.yaml"), cal, ["polaris"])
    pred = np.array(
        [
            collective_time(fit.cluster, op, s, nodes=int(n)).time_s
            for s, n in zip(test.nbytes, test.nodes, strict=True)
        ]
    )
    alpha, bw = alpha_beta_fit(cal)
    ab = alpha_beta_predict(test, alpha, bw)
    return test, np.abs(pred / test.time_s - 1), np.abs(ab / test.time_s - 1)


def test_all_reduce_fit_on_2_and_8_nodes_predicts_256_and_540(points):
    """Reaches 10.6% / 27.5% (256 nodes) and 24.3% / 30.6% (540 nodes); the alpha-beta ring fitted the same
    way misses by 242% / 750% and 513% / 1409% (its ring latency grows with 1,024 and 2,160 ranks)."""
    test, err, ab = _errors(points["all_reduce"], "all_reduce", (2, 8))
    assert len(err) == 12
    for n, median, worst in ((256, 0.12, 0.30), (540, 0.26, 0.33)):
        m = test.nodes == n
        assert np.median(err[m]) <= median and err[m].max() <= worst, (n, np.median(err[m]), err[m].max())
        assert np.median(err[m]) < 0.1 * np.median(ab[m])


def test_all_gather_fit_on_2_nodes_predicts_8(points):
    """1.4% median at 8 nodes (worst 30.9%: the measured 32 MiB row, 1.6 ms, is slower than its neighbours
    suggest); the alpha-beta ring reaches 6.7% / 11.9%."""
    test, err, _ = _errors(points["all_gather"], "all_gather", (2,))
    m = test.nodes == 8
    assert m.sum() == 6 and np.median(err[m]) <= 0.03 and err[m].max() <= 0.33


def test_all_gather_at_256_and_540_nodes_is_a_known_miss(points):
    """Not met: 80% / 91% (256 nodes) and 82% / 92% (540 nodes) too fast after a 2+8-node fit. The measured
    rows cost ~30-45 us per ring step at 256 and 540 nodes from 32 MiB to 1 GiB, which the 2- and 8-node rows
    do not show. The bound only records it, so a change that makes it worse fails."""
    test, err, _ = _errors(points["all_gather"], "all_gather", (2, 8))
    for n in (256, 540):
        m = test.nodes == n
        assert np.median(err[m]) <= 0.85 and err[m].max() <= 0.93, (n, np.median(err[m]), err[m].max())
