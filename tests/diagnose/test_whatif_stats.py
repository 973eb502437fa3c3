"""What-if arithmetic, leave-one-out medians, runs test and locality on hand-made inputs."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from fabricpace.diagnose.config import DiagnoseConfig
from fabricpace.diagnose.locality import shared_locality
from fabricpace.diagnose.stats import (
    block_bootstrap,
    expected_max_normal,
    loo_median,
    runs_test_z,
    whatif_saving,
)


def test_whatif_replaces_culprit_with_median_and_recomputes_the_max():
    # 3 ranks × 4 steps of lateness; rank 2 is 10 ns late every step, step time 100 ns.
    late = np.array([[0, 1, 0, 2], [1, 0, 2, 0], [10, 11, 12, 10]], dtype=float)
    mask = np.array([False, False, True])
    saving, per_step = whatif_saving(late, mask, np.full(4, 100.0))
    # After: rank 2 = median of ranks 0,1 per step = [0.5, 0.5, 1, 1]; max = [1, 1, 2, 2].
    assert per_step.tolist() == [9, 10, 10, 8]
    assert saving == pytest.approx(37 / 400)


def test_whatif_without_culprits_saves_nothing():
    late = np.random.default_rng(0).normal(size=(4, 10))
    assert whatif_saving(late, np.zeros(4, bool), np.ones(10))[0] == 0.0


@pytest.mark.parametrize("r", [1, 2, 3, 6, 9])
def test_loo_median_matches_brute_force(r):
    rng = np.random.default_rng(r)
    x = rng.normal(size=(r, 11))
    x[rng.random(x.shape) < 0.15] = np.nan
    got = loo_median(x)
    for i in range(r):
        for j in range(11):
            others = np.delete(x[:, j], i)
            others = others[~np.isnan(others)]
            want = np.median(others) if others.size else np.nan
            assert (np.isnan(want) and np.isnan(got[i, j])) or got[i, j] == pytest.approx(want)


def test_runs_test_separates_periods_from_scatter():
    clustered = np.zeros(200, bool)
    clustered[80:120] = True
    scattered = np.random.default_rng(1).random(200) < 0.2
    assert runs_test_z(clustered) < -8
    assert abs(runs_test_z(scattered)) < 3


def test_expected_max_normal_matches_references():
    # REFERENCES.md: c_4 ≈ 1.03, c_8 ≈ 1.42, c_16 ≈ 1.77, c_32 ≈ 2.07
    for n, c in ((4, 1.03), (8, 1.42), (16, 1.77), (32, 2.07)):
        assert expected_max_normal(n) == pytest.approx(c, abs=0.01)


def test_block_bootstrap_confidence():
    cfg = DiagnoseConfig()
    t = np.full(100, 100.0)
    assert block_bootstrap(np.full(100, 10.0), t, 0.05, cfg)[0] == 1.0
    assert block_bootstrap(np.full(100, 1.0), t, 0.05, cfg)[0] == 0.0


def _info():
    # 4 nodes × 4 ranks, 2 nodes per leaf.
    r = np.arange(16)
    return pl.DataFrame(
        {
            "rank": r,
            "node": r // 4,
            "leaf": r // 8,
            "numa": (r % 4) // 2,
            "gpu": [f"GPU{x % 4}" for x in r],
            "nic": [f"mlx5_{(x % 4) // 2}" for x in r],
        }
    )


def test_locality_whole_node_whole_leaf_single_gpu_and_shared_nic():
    info, world = _info(), list(range(16))
    assert shared_locality([4, 5, 6, 7], info, world)["attribute"] == "node"
    assert shared_locality(list(range(8, 16)), info, world) == {
        "attribute": "leaf",
        "values": [1],
        "precision": 1.0,
        "ranks_with_values": 8,
    }
    one = shared_locality([5], info, world)
    assert one["attribute"] == "gpu" and one["values"] == ["1:GPU1"]
    numa = shared_locality([6, 7], info, world)
    assert numa["attribute"] in ("numa", "nic") and numa["precision"] == 1.0
    # Ranks 2,3 of every node use mlx5_1: a rail/NIC-name problem across nodes.
    rail = shared_locality([2, 3, 6, 7, 10, 11, 14, 15], info, world)
    assert rail["attribute"] in ("nic", "numa") and rail["values"] in (["mlx5_1"], ["1"], [1])
    assert shared_locality([0, 5, 10], info, world) is None
