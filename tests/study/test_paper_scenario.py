"""The shipped `paper` scenario keeps the paper's qualitative baseline shape (short runs, one repeat)."""

from __future__ import annotations

from fabricpace.study import StudyPlan, load_scenario, run_study


def _paper_rows(tmp_path, *, nodes, modes, steps, warmup, repeats=1):  # type: ignore[no-untyped-def]
    """``repeats`` runs (seeds 1, 2, ...) of the shipped `paper` scenario in the simulator."""
    sc = load_scenario("paper")
    plan = StudyPlan(
        backend="sim", nodes=nodes, modes=modes, repeats=repeats, steps=steps, warmup=warmup, seed=1,
        out_dir=tmp_path / "s", cluster=sc.cluster, workload=sc.workload, noise=sc.noise,
    )
    return run_study(plan).rows


def test_paper_scenario_bends_and_gets_noisier(tmp_path):
    assert load_scenario("paper").study.nodes == [4, 8, 16]
    rows = {r["nodes"]: r for r in _paper_rows(tmp_path, nodes=(4, 16), modes=("baseline",), steps=300,
                                               warmup=50, repeats=3)}
    # ECMP paths are the run's (session 4), so a 16-node run's CV depends on where its connections
    # hash relative to the tenants' links: 0.027-0.088 over seeds 1-5, mean 0.043 (4 nodes: 0.010);
    # efficiency 0.865. Hence the mean of 3 seeds, as the study reports it.
    assert rows[16]["efficiency"] < 0.93
    assert rows[16]["cv"] > 2.5 * rows[4]["cv"]
    assert 900 < rows[4]["throughput"] < 1150  # near the paper's 1024 samples/s at 4 nodes (calibration)


def test_pacing_costs_at_most_0_3_percent_at_4_nodes(tmp_path):
    """Issue 6: at 4 nodes the paper scenario with pacing is no worse than -0.3% (same seed)."""
    rows = {r["mode"]: r for r in _paper_rows(tmp_path, nodes=(4,), modes=("baseline", "paced"), steps=300,
                                              warmup=50)}
    assert rows["paced"]["throughput"] >= 0.997 * rows["baseline"]["throughput"]
