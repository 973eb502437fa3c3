"""Study rows from run directories: summarize_run by hand, aggregation statistics, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fabricpace.run import Manifest, RunWriter, load_run
from fabricpace.study.metrics import summarize_run
from fabricpace.study.runner import StudyPlan, aggregate
from fabricpace.study.stats import mean_ci, t975


def _hand_run(path, iters_ms):
    """Two ranks; step s lasts iters_ms[s]; rank 1 starts 1 ms later and ends at the same time."""
    w = RunWriter(path, Manifest(source="observer", world_size=2, nodes=1, gpus_per_node=2))
    t, rows = 0, {k: [] for k in ("rank", "step", "t_start_ns", "t_end_ns", "samples")}
    for s, ms in enumerate(iters_ms):
        end = t + int(ms * 1e6)
        for r in (0, 1):
            rows["rank"].append(r)
            rows["step"].append(s)
            rows["t_start_ns"].append(t + r * 1_000_000)
            rows["t_end_ns"].append(end)
            rows["samples"].append(8)
        t = end
    zeros = [0] * len(rows["rank"])
    cols = {
        **rows,
        **{c: zeros for c in ("compute_ns", "wait_ns", "comm_ns", "data_ns", "gc_ns", "paced_ns")},
    }
    w.write("steps", cols, rank=0)
    w.write(
        "ranks",
        {
            c: [0, 1] if c in ("rank", "local_rank") else [None, None]
            for c in (
                "rank",
                "node",
                "local_rank",
                "host",
                "leaf",
                "dp_rank",
                "pp_stage",
                "tp_rank",
                "numa",
                "gpu",
                "nic",
                "clock_offset_ns",
                "clock_err_ns",
            )
        },
    )
    w.close()
    return load_run(path)


def test_summarize_run_by_hand(tmp_path):
    iters = [500, 100, 110, 90, 100]  # step 0 is warm-up
    s = summarize_run(_hand_run(tmp_path, iters), warmup=1)
    kept = np.array(iters[1:]) / 1e3
    assert s["steps"] == 4
    assert s["throughput"] == pytest.approx(4 * 16 / kept.sum())
    assert s["cv"] == pytest.approx(kept.std() / kept.mean())
    assert s["iter_mean_s"] == pytest.approx(kept.mean())
    assert s["period_s"] == pytest.approx(kept.sum() / 4)  # back-to-back steps: the sum of iterations


def test_period_is_wall_per_step_when_iterations_overlap(tmp_path):
    # (audit 16, planner 8) rank 1 starts each step 1 ms after rank 0 and ends with it, and rank 0
    # starts the next step where the last one ended: iterations (first start to last end) equal the
    # steps here; shift rank 1 so that its steps overlap rank 0's next one, and the mean iteration
    # exceeds the time per step on the job's clock, which is what the period reports.
    run = _hand_run(tmp_path, [100, 100, 100, 100, 100])
    import polars as pl

    run.steps = run.steps.with_columns(
        pl.when(pl.col("rank") == 1).then(pl.col("t_end_ns") + 20_000_000).otherwise(pl.col("t_end_ns"))
        .alias("t_end_ns")
    )
    s = summarize_run(run, warmup=1)
    assert s["iter_mean_s"] == pytest.approx(0.120)
    assert s["period_s"] == pytest.approx((0.4 + 0.02) / 4)  # wall 420 ms over 4 steps


def test_summarize_run_refuses_too_few_steps(tmp_path):
    from fabricpace import RunDirError

    with pytest.raises(RunDirError, match="warm-up"):
        summarize_run(_hand_run(tmp_path, [100, 100, 100]), warmup=2)


def test_mean_ci_matches_t_interval():
    m, ci = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and ci is not None
    assert ci[1] - m == pytest.approx(4.303 * 1.0 / np.sqrt(3))
    assert mean_ci([5.0]) == (5.0, None)
    assert t975(22) == t975(20) and t975(1000) == pytest.approx(1.96)


def test_aggregate_efficiency_and_paired_delta(tmp_path):
    plan = StudyPlan(
        backend="sim",
        nodes=(2, 4),
        modes=("baseline", "paced"),
        repeats=2,
        steps=10,
        warmup=1,
        seed=0,
        out_dir=tmp_path,
    )
    pts = []
    for r in range(2):
        pts += [
            {"nodes": 2, "mode": "baseline", "repeat": r, "throughput": 100.0 + r, "cv": 0.02, "steps": 9},
            {"nodes": 4, "mode": "baseline", "repeat": r, "throughput": 180.0 + r, "cv": 0.05, "steps": 9},
            {"nodes": 2, "mode": "paced", "repeat": r, "throughput": 100.0 + r, "cv": 0.02, "steps": 9},
            {
                "nodes": 4,
                "mode": "paced",
                "repeat": r,
                "throughput": 189.0 + 1.05 * r,
                "cv": 0.03,
                "steps": 9,
            },
        ]
    rows = {(x["nodes"], x["mode"]): x for x in aggregate(plan, pts)}
    assert rows[(4, "baseline")]["efficiency"] == pytest.approx((180.5 / 4) / (100.5 / 2))
    assert rows[(4, "paced")]["delta_pct"] == pytest.approx(5.0)
    assert rows[(2, "paced")]["delta_pct"] == pytest.approx(0.0)
    assert rows[(2, "baseline")]["delta_pct"] is None
    assert rows[(4, "baseline")]["repeats"] == 2 and rows[(4, "baseline")]["steps"] == 9


def test_cv_interval_stays_at_or_above_zero(tmp_path):
    # Two repeats with CVs 0.01 and 0.05: mean 0.03 minus t(1) x s/sqrt(2) = 0.03 - 0.254 < 0.
    plan = StudyPlan(backend="sim", nodes=(2,), modes=("baseline",), repeats=2, steps=10, warmup=1, seed=0,
                     out_dir=tmp_path)
    pts = [{"nodes": 2, "mode": "baseline", "repeat": r, "throughput": 100.0, "cv": cv, "steps": 9}
           for r, cv in enumerate((0.01, 0.05))]
    (row,) = aggregate(plan, pts)
    assert row["cv"] == pytest.approx(0.03)
    assert row["cv_ci"][0] == 0.0
    assert row["cv_ci"][1] == pytest.approx(0.03 + 12.706 * 0.02828 / np.sqrt(2), rel=1e-3)


def test_study_cli_json_rows(cli, tmp_path):
    out = tmp_path / "study"
    r = cli(
        "study",
        "--backend",
        "sim",
        "--cluster",
        "single-switch",
        "--workload",
        "resnet-50",
        "--nodes",
        "1,2",
        "--repeats",
        "2",
        "--steps",
        "30",
        "--warmup",
        "5",
        "--out",
        str(out),
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    # the rows, plus where they were written (test_audit_study_outputs.py)
    assert {"rows", "study_dir", "study_json", "figures", "plan"} == set(doc) and len(doc["rows"]) == 2
    for row in doc["rows"]:
        assert {
            "backend",
            "nodes",
            "mode",
            "throughput",
            "throughput_ci",
            "cv",
            "efficiency",
            "steps",
            "repeats",
        } <= set(row)
        assert row["backend"] == "sim" and row["repeats"] == 2 and row["steps"] == 25
    assert (out / "study.json").is_file() and (out / "figures.html").is_file()
    html = (out / "figures.html").read_text()
    assert "Throughput against nodes" in html and "Per-rank timeline" in html
    study = json.loads((out / "study.json").read_text())
    assert len(study["points"]) == 4 and all((tmp_path / p["run_dir"]).exists() for p in study["points"])


def test_study_cli_bad_input(cli, tmp_path):
    r = cli(
        "study",
        "--backend",
        "sim",
        "--cluster",
        "single-switch",
        "--workload",
        "resnet-50",
        "--nodes",
        "1,x",
        "--out",
        str(tmp_path / "s"),
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--nodes" in r.stderr
    assert not (tmp_path / "s").exists()


def test_study_plan_checks(tmp_path):
    from fabricpace import InputError
    from fabricpace.study.runner import check_plan

    base = dict(
        backend="sim",
        nodes=(1,),
        modes=("baseline",),
        repeats=1,
        steps=10,
        warmup=2,
        seed=0,
        out_dir=tmp_path,
        cluster="single-switch",
        workload="resnet-50",
    )
    check_plan(StudyPlan(**base))
    for bad, needle in (
        ({"cluster": None}, "--cluster"),
        ({"modes": ("fast",)}, "--compare"),
        ({"steps": 3}, "--steps"),
        ({"backend": "cloud"}, "--backend"),
        ({"nodes": (2, 1, 2)}, "node count 2 is given twice"),
        ({"nodes": (0, 1)}, "at least 1"),
        ({"seed": -1}, "--seed -1"),  # before: a traceback from numpy's SeedSequence
        ({"nodes": (1, 33)}, "--nodes 33: cluster 'single-switch' has only 32"),
        ({"backend": "local", "nodes": (1, 2), "cluster": None}, "needs at least 2 ranks"),
    ):
        with pytest.raises(InputError, match=needle):
            check_plan(StudyPlan(**{**base, **bad}))
    # What simulate() refuses for one node count fails the whole plan before anything runs.
    ghost = tmp_path / "ghost.yaml"
    ghost.write_text("slow:\n  - {rank: 9, factor: 2}\n")
    with pytest.raises(InputError, match="rank 9 does not exist"):
        check_plan(StudyPlan(**{**base, "nodes": (2, 1), "noise": str(ghost)}))
    # (audit 18: the message names the job that lacks the rank and the node fault that serves every
    # count; a scenario with nodes [4, 96] and rank 500 read "the job has ranks 0..31" only)
    with pytest.raises(InputError, match=r"in the 1-node job \(ranks 0\.\.\d+\); run at least \d+ nodes, "
                       r"or name its node instead \(node: \d+\)"):
        check_plan(StudyPlan(**{**base, "nodes": (2, 1), "noise": str(ghost)}))


def test_study_that_cannot_run_every_point_writes_nothing(cli, tmp_path):
    """Before: the 1-node runs ran and were written, then the 64-node point failed (exit 2) and left a
    half-written study folder behind."""
    out = tmp_path / "s"
    r = cli(
        "study", "--cluster", "single-switch", "--workload", "resnet-50", "--nodes", "1,64", "--steps", "10",
        "--warmup", "2", "--repeats", "1", "--out", str(out),
    )  # fmt: skip
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--nodes 64" in r.stderr
    assert not out.exists()


def test_missing_backend_module_is_an_input_error():
    # A backend module absent from an install (a trimmed package) is bad input, not a crash.
    from fabricpace._errors import InputError
    from fabricpace.study.runner import _backend_module

    with pytest.raises(InputError, match=r"fabricpace\.study\.no_such_backend"):
        _backend_module("no_such_backend")
    assert _backend_module("local").run_point is not None


def test_scenario_study_block_errors_name_scenario_yaml(cli, tmp_path):
    """Values that came from a scenario folder are reported against scenario.yaml and its field, not
    against command-line options the user never passed."""
    import yaml

    paper = Path(__file__).resolve().parents[2] / "src/fabricpace/data/scenarios/paper"

    def folder(name: str, **changes: object) -> Path:
        d = tmp_path / name
        d.mkdir()
        for f in ("cluster.yaml", "workload.yaml", "noise.yaml"):
            (d / f).write_text((paper / f).read_text())
        spec = yaml.safe_load((paper / "scenario.yaml").read_text())
        spec.update(changes)
        (d / "scenario.yaml").write_text(yaml.safe_dump(spec))
        return d

    cases = {
        "steps": ({"study": {"steps": 60, "warmup": 80}}, "study"),
        "nodes": ({"study": {"nodes": [4, 128]}}, "study.nodes"),
        # before: "--nodes 0: must be at least 1" (an option never passed), after an empty study folder
        "zero": ({"study": {"nodes": [0, 4]}}, "study.nodes"),
        # before: the 4-node runs, then "--out .../sim-n4-baseline-r0: already exists" for the second 4
        "twice": ({"study": {"nodes": [4, 4]}}, "study.nodes"),
        "missing": ({"workload": "workloads.yaml"}, "'workload'"),
    }
    for name, (changes, field) in cases.items():
        d = folder(name, **changes)
        r = cli("study", "--scenario", str(d), "--compare", "baseline", "--out", str(tmp_path / f"o-{name}"))
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, (name, r.stderr)
        assert "scenario.yaml" in lines[0] and field in lines[0] and "--" not in lines[0], (name, lines[0])
        assert not (tmp_path / f"o-{name}").exists()
