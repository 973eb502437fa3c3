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
