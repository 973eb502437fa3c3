"""One-off stalls (fault audit 15, findings 8 and 3, diagnose side): when one or a few steps carry most of
a finding's loss, the diagnosis names the step, the late rank and the duration, gives the finding's
number without that step and says what to check — not "random per-step variation amplified by
synchronization" with a CV that one step made.

Recorded runs (``data/real``, compacted from the audit's run directories: manifest, ranks, steps,
collectives; 3 real gloo ranks on one host under the observer, ``fjob.py``, 3 ms sleep per step):

* ``audit15-sigstop-rank1`` — rank 1 stopped by SIGSTOP for 45 s, then SIGCONT (``t2_sigstop.sh 45``):
  step 322 took 45.07 s, the median step 8.4 ms. Before: "sync_amplification 73.6%", "step 33.16 ms
  (CV 30.538)", and "rank 1 alone accounts for 70.0% … check that host (a CPU quota …)".
* ``audit15-window-mismatch`` — rank 1 passed ``window=20``, ranks 0 and 2 ``window=50``
  (``t2_mismatch.sh W``): rank 1's window gather waited out ``gather_timeout_s`` (30 s) at step 22,
  and the manifest records ``observer_failures.gather``. Before: "sync_amplification 86.5%",
  "step 61.20 ms (CV 20.336)" — the observer's own stall read as the job's.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fabricpace.diagnose import DiagnoseConfig, diagnose

REAL = Path(__file__).parent / "data" / "real"
ROOT = Path(__file__).resolve().parents[2]


def _sync(d):
    (f,) = [f for f in d.findings if f.mode == "sync_amplification"]
    return f


def test_a_45_s_sigstop_of_one_rank_is_named_as_one_stall() -> None:
    d = diagnose([REAL / "audit15-sigstop-rank1"])
    f = _sync(d)
    assert f.severity_pct == pytest.approx(73.6, abs=0.1)  # the job did lose that time: severity unchanged
    stalls = f.evidence["one_off_stalls"]
    (s,) = stalls["steps"]
    assert s["step"] == 322 and s["step_ms"] == pytest.approx(45072, abs=5)
    assert [r["rank"] for r in s["late_ranks"]] == [1]
    assert s["late_ranks"][0]["lateness_ms"] == pytest.approx(45064, abs=5)
    assert s["late_ranks"][0]["in"] == "compute"  # the stopped rank's timer ran inside its compute phase
    assert s["wall_clock"] == "01:50:37 UTC"  # manifest created 01:50:34 + 2.97 s (+0.5 s for the cut second)
    assert stalls["loss_share"] > 0.9
    assert stalls["severity_without_pct"] == pytest.approx(15.8, abs=0.1) and stalls["reported_without"]
    rec = f.recommendation
    assert rec.startswith("Most of this loss (93%) is one stall: step 322 ")
    assert "took 45.07 s where the median step takes 8.44 ms: rank 1 arrived 45.06 s late" in rec
    assert "check what happened on rank 1's host at that time" in rec and "SIGSTOP" in rec
    assert "Without step 322, sync_amplification is 15.8% of step time: " in rec
    # The leading rank and what the loss is made of are taken without the stall: rank 1's "70.0% of
    # step time" was the stall itself.
    assert "rank 1 alone accounts" not in rec
    assert f.evidence["largest_single_rank_saving"]["saving_pct"] < 10
    # The step spread: a robust CV beside the CV one step made; the run's headline says which step.
    assert f.evidence["step_cv"] > 30 and f.evidence["step_cv_robust"] < 0.5
    m = d.runs[0].metrics
    assert m["step_outliers"]["steps"] == [{"step": 322, "step_ms": pytest.approx(45072, abs=5)}]
    assert m["step_outliers"]["step_ms_mean_without"] == pytest.approx(10.40, abs=0.01)
    assert m["step_cv_robust"] < 0.5 and m["step_p95_over_p50"] < 3
    # The contention finding's loss is spread over many periods: not a one-off, nothing added.
    (top,) = [f for f in d.findings if f.mode == "topology_contention"]
    assert "one_off_stalls" not in top.evidence


def test_the_observers_own_gather_stall_is_said_to_be_the_observers() -> None:
    d = diagnose([REAL / "audit15-window-mismatch"])
    f = _sync(d)
    (s,) = f.evidence["one_off_stalls"]["steps"]
    assert s["step"] == 22 and [r["rank"] for r in s["late_ranks"]] == [1]
    assert s["observer"]["part"] == "gather" and s["observer"]["timeout_s"] == 30.0
    rec = f.recommendation
    assert "fabricpace's own window gather timing out (gather_timeout_s 30 s" in rec
    assert "most likely the observer's stall, not the job's" in rec
    assert "same settings (window=, gather_lag_steps=)" in rec
    assert "Without step 22, sync_amplification is 13.0%" in rec
    assert "observer's gather timeout" in f.evidence["one_off_stalls"]["summary"]
    assert d.runs[0].metrics["step_outliers"]["steps"][0]["step"] == 22


def test_text_output_leads_with_the_median_and_the_stall(cli, recorded) -> None:
    run = recorded("audit15-sigstop-rank1")
    r = cli("diagnose", str(run))
    assert r.returncode == 0, r.stderr
    # rich wraps long lines, and table cells between borders: the sync row's other columns are blank
    # on its continuation lines, so its evidence reads whole once borders and spacing are dropped.
    out = " ".join(r.stdout.replace("│", " ").split())
    assert "1980 steps, step 8.44 ms median (robust CV 0.307, p95/p50 2.10); step 322 took 45.07 s: " in out
    assert "mean 33.16 ms (CV 30.538) with it, 10.40 ms (CV 1.744) without" in out
    assert "sync_amplification 73.6% 0.99 - one stall: step 322 (rank 1 +45.06 s) = 93% of this loss;" in out
    assert "without it 15.8%; skew 73.6% of step" in out
    assert "step CV 30.538 (robust 0.307)" in out
    written = json.loads((run / "diagnosis.json").read_text())
    assert written["findings"][0]["evidence"]["one_off_stalls"]["steps"][0]["step"] == 322


def test_the_rule_names_one_or_a_few_steps_only() -> None:
    from fabricpace.diagnose.one_off import dominant_steps

    cfg = DiagnoseConfig()
    rng = np.random.default_rng(0)
    noise = rng.exponential(1.0, 2000)  # per-step loss; the median step takes 10 (same unit)
    assert dominant_steps(noise, cfg, 10.0).size == 0  # spread noise: no step carries most of it
    one = noise.copy()
    one[700] = 5000.0
    assert dominant_steps(one, cfg, 10.0).tolist() == [700]
    two = noise.copy()
    two[[10, 1500]] = 1500.0  # together > 50%, neither alone
    assert sorted(dominant_steps(two, cfg, 10.0).tolist()) == [10, 1500]
    many = noise.copy()
    many[::100] = 200.0  # 20 long pauses (1% of steps, more than 5): rare pauses, not a one-off
    assert dominant_steps(many, cfg, 10.0).size == 0
    short = np.ones(60)
    short[7] = 40.0  # one step of 60 with 40% of the loss: not most of it
    assert dominant_steps(short, cfg, 10.0).size == 0
    short[7] = 200.0
    assert dominant_steps(short, cfg, 10.0).tolist() == [7]
    # ... but a step that lost less than 5 median steps is no stall, whatever its share (a real 9-step
    # run: step 1 took 23.6 ms among steps of 8 ms)
    assert dominant_steps(short, cfg, 50.0).size == 0
    assert dominant_steps(np.zeros(50), cfg, 10.0).size == 0


def test_no_one_off_on_the_other_recorded_runs() -> None:
    """Real runs with GC pauses, slow ranks, evaluations and checkpoints: no finding reads as a stall."""
    for run in sorted(REAL.iterdir()):
        if run.name in ("audit15-sigstop-rank1", "audit15-window-mismatch"):
            continue
        d = diagnose([run])
        for f in d.findings:
            assert "one_off_stalls" not in f.evidence, (run.name, f.mode, f.evidence["one_off_stalls"])
        assert "step_outliers" not in d.runs[0].metrics, run.name


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_real_gloo_rank_stopped_3_s_is_one_stall(tmp_path, rank_env) -> None:
    """Two real gloo ranks under the observer; rank 1 is frozen by a real SIGSTOP for 3 s at step 100
    (``jobs/stop_rank.py``). The finding whose loss it is names step 100, rank 1 and ~3 s."""
    run = tmp_path / "run"
    procs = []
    for rank in range(2):
        env = rank_env(rank)
        cmd = [
            sys.executable,
            str(Path(__file__).parent / "jobs" / "stop_rank.py"),
            "--run-dir",
            str(run),
            "--steps",
            "200",
            "--stop-rank",
            "1",
            "--stop-step",
            "100",
            "--stop-s",
            "3",
        ]
        procs.append(
            subprocess.Popen(
                cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out[-2000:]
    d = diagnose([run])
    stalled = [f for f in d.findings if "one_off_stalls" in f.evidence]
    assert stalled, [(f.mode, f.severity_pct, f.recommendation) for f in d.findings]
    for f in stalled:
        (s,) = f.evidence["one_off_stalls"]["steps"]
        assert s["step"] == 100
        assert [r["rank"] for r in s["late_ranks"]] == [1]
        assert 2900 <= s["late_ranks"][0]["lateness_ms"] <= 4000
        ev = f.evidence["one_off_stalls"]
        assert ev["severity_without_pct"] < f.severity_pct
        assert f.recommendation.startswith("Most of this loss")
        assert "step 100" in f.recommendation and "rank 1 arrived" in f.recommendation
    assert [x["step"] for x in d.runs[0].metrics["step_outliers"]["steps"]] == [100]
