"""A third collective on the p5 validation cluster: alltoall_perf at 2..32 nodes (tests/fabric/data/README.md,
``p5efa_alltoall_table.csv``). The model is fitted on the 2- and 4-node rows and predicts 8, 16 and 32 nodes,
as for all-reduce and all-gather; the bounds below record what it reaches, so a change that makes it worse
fails (the issue's 5% / 25% target is for all-reduce and all-gather; all-to-all misses it, see
docs/cluster-files.md, 'Accuracy')."""

from __future__ import annotations

import numpy as np
import pytest

from fabricpace.fabric import collective_time, load_cluster
from fabricpace.fabric.calibrate import (
    Points,
    alpha_beta_fit,
    alpha_beta_predict,
    calibrate_points,
    points_from_table,
    select,
)


@pytest.fixture(scope="module")
def points() -> Points:
    from pathlib import Path

    return points_from_table(Path(__file__).parent / "data" / "p5efa_alltoall_table.csv", "all_to_all")


def test_alltoall_table_loads_every_node_count_and_size(points):
    assert sorted(set(points.nodes.tolist())) == [2, 4, 8, 16, 32] and len(points) == 35
    assert set(points.gpn.tolist()) == {8} and set(points.op.tolist()) == {"all_to_all"}
    assert sorted(set((points.nbytes.astype(np.int64) >> 20).tolist())) == [32, 64, 128, 256, 512, 1024, 2048]
    # the published rows with a stray space before 'false' ('4,32,32,1000, false,35.56,...') are kept
    row = (points.nodes == 4) & (points.nbytes == 32 << 20)
    np.testing.assert_allclose(points.time_s[row], (32 << 20) / 35.56e9)
    # nccl-tests' all-to-all busbw = algbw x (n-1)/n: the published 32-node, 2048 MiB busbw is 40.78 GB/s
    last = (points.nodes == 32) & (points.nbytes == 2048 << 20)
    np.testing.assert_allclose((2048 << 20) / points.time_s[last] / 1e9 * 255 / 256, 40.78, rtol=1e-3)


def test_alltoall_fit_on_2_and_4_nodes_predicts_8_16_32_nodes(points):
    """Reaches 10.6% median / 27.6% worst (n=21), against 27.6% / 176.9% for the alpha-beta ring fitted the
    same way; the bounds leave a little room for numerical noise in the fit, not for a worse model."""
    cal_mask = np.isin(points.nodes, (2, 4))
    cal, test = select(points, cal_mask), select(points, ~cal_mask)
    fit = calibrate_points(load_cluster("p5-efa"), cal, ["p5-alltoall"])
    assert fit.kept == ("tree_efficiency", "nvls_tree_efficiency", "net_overhead_us")  # p2p: neither
    pred = np.array(
        [
            collective_time(fit.cluster, "all_to_all", s, nodes=int(n)).time_s
            for s, n in zip(test.nbytes, test.nodes, strict=True)
        ]
    )
    err = np.abs(pred / test.time_s - 1)
    alpha, bw = alpha_beta_fit(cal)
    ab_err = np.abs(alpha_beta_predict(test, alpha, bw) / test.time_s - 1)
    assert len(err) == 21
    assert np.median(err) <= 0.12 and err.max() <= 0.30, (np.median(err), err.max())
    assert np.median(err) < 0.5 * np.median(ab_err) and err.max() < 0.25 * ab_err.max()
    # 8 nodes, the nearest extrapolation, is within the target on this collective too
    eight = test.nodes == 8
    assert np.median(err[eight]) <= 0.05 and err[eight].max() <= 0.25
