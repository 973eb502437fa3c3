"""Calibration on real nccl-tests logs (tests/fabric/data, see its README): fit on 2 and 4 nodes, predict
8 nodes, and compare with a plain alpha-beta ring fitted the same way."""

from __future__ import annotations

import numpy as np
import pytest

from fabricpace.fabric import collective_time, load_cluster
from fabricpace.fabric.calibrate import (
    FastModel,
    alpha_beta_fit,
    alpha_beta_predict,
    calibrate_cluster,
    points_from_logs,
)
from fabricpace.fabric.nccl_tests import parse_log


@pytest.fixture(scope="module")
def logs(request):
    from pathlib import Path

    data = Path(request.fspath).parent / "data"
    return {n: parse_log(data / f"h100ib_n{n}_all_reduce.log") for n in (2, 4, 8)}


def test_fit_on_2_and_4_nodes_predicts_8_nodes(logs):
    fit = calibrate_cluster(load_cluster("dgx-h100-ib"), [logs[2], logs[4]])
    test = points_from_logs([logs[8]])  # 32 MiB .. 8 GiB
    pred = np.array([collective_time(fit.cluster, "all_reduce", s, nodes=8).time_s for s in test.nbytes])
    err = np.abs(pred / test.time_s - 1)
    alpha, bw = alpha_beta_fit(points_from_logs([logs[2], logs[4]]))
    ab_err = np.abs(alpha_beta_predict(test, alpha, bw) / test.time_s - 1)
    assert np.median(err) <= 0.05 and err.max() <= 0.25, err
    assert np.median(err) < np.median(ab_err) and err.max() < ab_err.max()
    assert 0.5 < fit.params["net_efficiency"] < 1.0 and fit.cluster.tuning.source.startswith("fit:")


def test_the_fit_says_what_its_rows_cannot_tell(logs, cli, tmp_path):
    # The 2-node H100 rows (32 MiB+) all run as NVLS-tree: they constrain neither the ring's network
    # efficiency nor how times grow with node count, and the user is told so.
    fit = calibrate_cluster(load_cluster("dgx-h100-ib"), [logs[2]])
    assert fit.kept == ("net_efficiency", "tree_efficiency", "net_overhead_us") and fit.node_counts == (2,)
    assert "kept from the cluster: net_efficiency" in fit.summary()
    assert "every row is from 2 nodes" in fit.summary()
    both = calibrate_cluster(load_cluster("dgx-h100-ib"), [logs[2], logs[4]])
    assert "net_efficiency" not in both.kept and "every row" not in both.summary()
    r = cli("collective", "--nodes", "8", "--sizes", "1G", "--calibrate", logs[2].path)
    assert r.returncode == 0 and "every row is from 2 nodes" in r.stderr


def test_fast_model_equals_collective_time(logs):
    fit = calibrate_cluster(load_cluster("dgx-h100-ib"), [logs[2], logs[4]])
    pts = points_from_logs([logs[2], logs[4], logs[8]], min_bytes=1 << 20)
    fast = FastModel(fit.cluster, pts).times(**fit.params)
    slow = [
        collective_time(fit.cluster, "all_reduce", s, nodes=int(n)).time_s
        for s, n in zip(pts.nbytes, pts.nodes, strict=True)
    ]
    np.testing.assert_allclose(fast, slow, rtol=1e-12)


def test_calibration_refuses_logs_the_cluster_cannot_hold(logs):
    from fabricpace._errors import InputError

    small = load_cluster("single-switch").model_copy(update={"nodes": 4})
    with pytest.raises(InputError, match="8 nodes, more than cluster"):
        calibrate_cluster(small, [logs[8]])


# ---- the second validation cluster: AWS p5 / EFA, 2..32 nodes (a published table; see data/README.md) ----
def _p5_points(data_dir):
    from fabricpace.fabric.calibrate import points_from_table

    return points_from_table(data_dir / "p5efa_all_reduce_table.csv", "all_reduce")


def test_p5_table_times_are_size_over_algbw(data_dir):
    pts = _p5_points(data_dir)
    assert sorted(set(pts.nodes.tolist())) == [2, 4, 8, 16, 32]
    assert len(pts) == 45 and set(pts.gpn.tolist()) == {8}
    # first row of the table: 2 nodes, 32 MiB, out-of-place algbw 78.57 GB/s
    first = (pts.nodes == 2) & (pts.nbytes == 32 << 20)
    np.testing.assert_allclose(pts.time_s[first], (32 << 20) / 78.57e9)
    # busbw recomputed from the derived time matches the published busbw column (2(n-1)/n x algbw)
    last = (pts.nodes == 32) & (pts.nbytes == 8192 << 20)
    busbw = (8192 << 20) / pts.time_s[last] / 1e9 * 2 * 255 / 256
    np.testing.assert_allclose(busbw, 321.10, rtol=1e-3)


def _p5_gather_points(data_dir):
    from fabricpace.fabric.calibrate import points_from_table

    return points_from_table(data_dir / "p5efa_all_gather_table.csv", "all_gather")


def test_p5_all_gather_table_times_are_size_over_algbw(data_dir):
    pts = _p5_gather_points(data_dir)
    assert sorted(set(pts.nodes.tolist())) == [2, 4, 8, 16, 32] and len(pts) == 35
    # all-gather busbw = algbw x (n-1)/n: the published 32-node, 2048 MiB busbw is 262.77 GB/s
    last = (pts.nodes == 32) & (pts.nbytes == 2048 << 20)
    busbw = (2048 << 20) / pts.time_s[last] / 1e9 * 255 / 256
    np.testing.assert_allclose(busbw, 262.77, rtol=1e-3)


def _predict_op(data_dir, points, op):
    """Fit the p5 preset on ``op``'s 2- and 4-node rows, predict 8/16/32 nodes: (model, alpha-beta) errors."""
    from fabricpace.fabric.calibrate import calibrate_points, select

    cal_mask = np.isin(points.nodes, (2, 4))
    cal, test = select(points, cal_mask), select(points, ~cal_mask)
    fit = calibrate_points(load_cluster("p5-efa"), cal, ["p5"])
    pred = np.array(
        [
            collective_time(fit.cluster, op, s, nodes=int(n)).time_s
            for s, n in zip(test.nbytes, test.nodes, strict=True)
        ]
    )
    alpha, bw = alpha_beta_fit(cal)
    return np.abs(pred / test.time_s - 1), np.abs(alpha_beta_predict(test, alpha, bw) / test.time_s - 1)


def test_p5_fit_on_2_and_4_nodes_predicts_8_16_32_nodes(data_dir):
    """Regression bound, not the issue's target: on this cluster's all-reduce the model misses <=5% median /
    <=25% worst (see docs/cluster-files.md, 'Accuracy'; it reaches 10.5% / 31.9%); the bound records what
    it reaches so a change that makes it worse fails. It must beat the alpha-beta ring on the median too
    (13.6%) and its worst point by far (369.7%)."""
    err, ab_err = _predict_op(data_dir, _p5_points(data_dir), "all_reduce")
    assert len(err) == 27
    assert np.median(err) <= 0.12 and err.max() <= 0.33, (np.median(err), err.max())
    assert np.median(err) < np.median(ab_err) and err.max() < 0.5 * ab_err.max()


def test_calibration_fits_only_what_the_rows_depend_on(data_dir):
    """All-gather rows are rings: the tree and NVLS-tree efficiencies keep the cluster file's values. The p5
    all-reduce rows (NVLS-tree at 2 nodes, tree/LL128 and rings at 4) determine both efficiencies apart."""
    from fabricpace.fabric.calibrate import calibrate_points, select

    prior = load_cluster("p5-efa").with_tuning(tree_efficiency=0.77, nvls_tree_efficiency=0.66)
    gather = _p5_gather_points(data_dir)
    fit = calibrate_points(prior, select(gather, np.isin(gather.nodes, (2, 4))), ["ag"])
    assert fit.params["tree_efficiency"] == 0.77 and fit.params["nvls_tree_efficiency"] == 0.66
    reduce = _p5_points(data_dir)
    fit = calibrate_points(prior, select(reduce, np.isin(reduce.nodes, (2, 4))), ["ar"])
    assert fit.params["tree_efficiency"] != 0.77 and fit.params["nvls_tree_efficiency"] != 0.66
    assert fit.params["tree_efficiency"] < fit.params["nvls_tree_efficiency"] < fit.params["net_efficiency"]


def test_p5_all_gather_fit_on_2_and_4_nodes_predicts_8_16_32_nodes(data_dir):
    """All-gather on p5/EFA, fitted on its 2- and 4-node rows (14), predicted at 8/16/32 nodes (21 rows):
    the model reaches 5.2% median / 15.8% worst (target 5% / 25%); regression bound, and better than the
    alpha-beta ring on both."""
    err, ab_err = _predict_op(data_dir, _p5_gather_points(data_dir), "all_gather")
    assert len(err) == 21
    assert np.median(err) <= 0.06 and err.max() <= 0.18, (np.median(err), err.max())
    assert np.median(err) < np.median(ab_err) and err.max() < ab_err.max()


def test_points_from_table_bad_input_names_file_and_line(tmp_path):
    from fabricpace._errors import InputError, ParseError
    from fabricpace.fabric.calibrate import points_from_table

    bad = tmp_path / "t.csv"
    bad.write_text("Nodes,size(MB),out algbw(GB/s)\n2,32,1.5\n4,64,fast\n")
    with pytest.raises(ParseError, match=r"t\.csv:3"):
        points_from_table(bad, "all_reduce")
    bad.write_text("nodes,bytes\n2,3\n")
    with pytest.raises(ParseError, match="columns"):
        points_from_table(bad, "all_reduce")
    with pytest.raises(InputError, match="cannot read"):
        points_from_table(tmp_path / "missing.csv", "all_reduce")


def test_fast_model_equals_collective_time_with_a_tuner_plugin_and_rings_across_nodes(data_dir):
    """The fit's vectorized model takes the same plans (AWS's tuner for p5 all-reduce, NCCL's choice for
    all-gather) and the same proxy floor as ``collective_time``."""
    from fabricpace.fabric.calibrate import FastModel, Points

    ar, ag = _p5_points(data_dir), _p5_gather_points(data_dir)
    pts = Points(*(np.concatenate([getattr(ar, f), getattr(ag, f)]) for f in Points.__dataclass_fields__))
    values = dict(
        net_efficiency=0.85, tree_efficiency=0.45, nvls_tree_efficiency=0.7, base_us=50.0, net_overhead_us=9.0
    )
    cl = load_cluster("p5-efa").with_tuning(**values)
    fast = FastModel(cl, pts).times(**values)
    slow = [
        collective_time(cl, str(o), s, nodes=int(n)).time_s
        for o, s, n in zip(pts.op, pts.nbytes, pts.nodes, strict=True)
    ]
    np.testing.assert_allclose(fast, slow, rtol=1e-12)
