"""Ranks that do not start the observer together, on real gloo ranks (fault audit 15, findings 1, 3,
9, 5): a rank late to ``observe()``, a rank that never calls it, ranks with different ``window=``,
and rows of long steps lost to a SIGKILL. Short observer timeouts keep each test to seconds; the
assertions compare times with those timeouts."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pyarrow.parquet as pq

_spec = importlib.util.spec_from_file_location("_faults", Path(__file__).with_name("test_faults.py"))
assert _spec is not None and _spec.loader is not None
_faults = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_faults)
_launch = _faults._launch


def _rows(run: Path, table: str, rank: int) -> int:
    folder = run / table / f"rank-{rank:05d}"
    return sum(pq.read_metadata(p).num_rows for p in folder.glob("*.parquet")) if folder.is_dir() else 0


def test_a_rank_late_to_observe_costs_only_its_lateness(launcher, tmp_path):
    # Rank 1 reaches observe() 14 s after rank 0, which gives up after gather_timeout_s (8 s). Before,
    # rank 1 then blocked in new_group's gloo connect to a peer that had left: 40 s in observe(), and
    # rank 0 was held 46 s in DDP's first all-reduce (with the default 30 s timeout: ~110 s, and a job
    # with a 120 s collective timeout died). Now rank 1 reads "off" on the Store at once.
    recs = _launch(launcher, tmp_path, "none", "--late-rank", "1", "--late-s", "14", "--gather-timeout", "8",
                   "--store-timeout", "5", "--steps", "12", timeout=150)
    assert [r["rc"] for r in recs] == [0, 0], recs[1]["stderr"][-2000:]
    assert recs[1]["observe_s"] < 2, recs[1]
    assert 7.5 < recs[0]["observe_s"] < 10, recs[0]
    assert recs[0]["train_s"] < 6 + 4, recs[0]  # waits in DDP for rank 1's remaining 6 s, no more
    for r in recs:
        assert list(r["failures"]) == ["observer"], r["failures"]  # nothing else: no window work
        assert r["run_dir"] is not None
        assert "_all_gather" not in r["stderr"] and "gather disabled" not in r["stderr"]
    assert "after its peers gave up" in recs[1]["failures"]["observer"]
    assert "1 of 2 rank(s) had not reached observe()" in recs[0]["failures"]["observer"]


def test_a_rank_that_never_observes_switches_the_others_off_once_and_quietly(launcher, tmp_path):
    recs = _launch(launcher, tmp_path, "none", "--skip-rank", "1", "--gather-timeout", "2", "--window", "3",
                   "--steps", "14", timeout=60)
    assert [r["rc"] for r in recs] == [0, 0], recs[0]["stderr"][-2000:]
    assert list(recs[0]["failures"]) == ["observer"], recs[0]["failures"]
    err = recs[0]["stderr"]
    assert err.count("fabricpace") == 1, err  # the one "observer disabled" line, no AttributeError
    assert "_all_gather" not in err


def test_ranks_with_different_window_settings_use_rank_0s_without_a_stall(launcher, tmp_path):
    # Rank 1 passes window=3 (and gather_lag_steps=0), rank 0 window=4: before, rank 1 started a
    # gather nobody joined and every rank lost gather_timeout_s (30 s here) at the first window.
    recs = _launch(launcher, tmp_path, "none", "--rank-window", "1:3:0", "--window", "4", "--steps", "20",
                   *_faults.SLOW_TIMEOUTS, timeout=90)
    assert [r["rc"] for r in recs] == [0, 0], recs[1]["stderr"][-2000:]
    for r in recs:
        assert r["window"] == [4, 2]
        assert r["failures"] == {}, r["failures"]
        assert r["train_s"] < 15, r
    assert "every rank uses rank 0's (window=4, gather_lag_steps=2)" in recs[0]["stderr"]
    assert recs[1]["stderr"].count("fabricpace observer") == 0  # rank 0 says it, once
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["extra"]["observer"]["window"] == 4


def test_long_steps_killed_lose_at_most_about_flush_interval(launcher, tmp_path):
    # 0.4 s steps, flush_every=50 and flush_interval_s=1: before, nothing was written for 50 steps
    # (20 s here; 500 s with 10 s steps), so a SIGKILL after 12 steps left no rows at all.
    recs = _launch(launcher, tmp_path, "kill", "--rank", "1", "--step", "12", "--steps", "30",
                   "--sleep-ms", "400", "--flush-every", "50", "--flush-interval", "1", "--window", "50",
                   "--user-timeout", "10", timeout=90)
    assert recs[1]["rc"] != 0
    run = tmp_path / "run"
    kept = _rows(run, "steps", 1)
    assert kept >= 12 - 5, kept  # at most ~1 s (+ the step in flight) of 0.4 s steps lost


def test_the_writers_lazy_import_is_paid_at_start_not_at_the_first_window(tmp_path):
    # Audit finding 22: the first part (written at step flush_every = the first window's step) made
    # pyarrow import numpy.ma on the writer thread: 20-40 ms of GIL and import lock while the
    # training thread built its first window vector (2 gloo ranks: step 49 took 38-53 ms against a
    # 13 ms median; now 20-25 ms). observe() imports it at start instead.
    import subprocess
    import sys

    code = ("import sys, torch, fabricpace; m = sys.modules; before = 'numpy.ma' in m; "
            f"o = fabricpace.observe(torch.nn.Linear(2, 2), run_dir={str(tmp_path / 'run')!r}); "
            "print(before, 'numpy.ma' in m); o.close()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "True"], out.stderr[-2000:]


def test_a_taken_metrics_port_is_named_and_a_run_that_wrote_nothing_says_so_at_close(tmp_path, caplog):
    # Audit finding 11: 'metrics disabled ... (OSError: [Errno 98] Address already in use)' did not
    # say which port; a run whose directory could not be written said so once at start, then exited
    # 0 with obs.run_dir naming a directory that held nothing.
    import logging
    import socket

    import fabricpace
    from fabricpace.observe import ObserverConfig

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with caplog.at_level(logging.WARNING, logger="fabricpace.observe"):
            obs = fabricpace.observe(None, run_dir="/proc/fabricpace-not-writable/run", metrics_port=port,
                                     config=ObserverConfig(flush_mode="main", window=5, status_line=False))
            for _ in range(12):
                with obs.step():
                    pass
            obs.close()
    metrics = obs.failures["metrics"]
    assert f"127.0.0.1:{port}" in metrics and "Address already in use" in metrics, metrics
    lines = [r.getMessage() for r in caplog.records if "nothing was written" in r.getMessage()]
    assert len(lines) == 1 and "/proc/fabricpace-not-writable" in lines[0], lines
