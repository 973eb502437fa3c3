"""The Observer in one process: recording, pacing hook calls, degradation, crash-safe files, no torch."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time

import pytest

import fabricpace
from fabricpace import ConfigError
from fabricpace.observe import Observer, ObserverConfig, observe

CFG = ObserverConfig(status_line=False, flush_every=4, flush_interval_s=0)


class Pacer:
    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[str] = []
        self.fail_on = fail_on

    def _hit(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail_on:
            raise RuntimeError(f"{name} broke")

    def on_step_start(self, step): self._hit("on_step_start")
    def on_step_end(self, step): self._hit("on_step_end"); return 500  # noqa: E702
    def before_bucket(self, i): self._hit("before_bucket")
    def after_bucket(self, i): self._hit("after_bucket")
    def on_window(self, step, summaries): self._hit("on_window"); self.last = summaries  # noqa: E702
    def batch_share(self, global_batch): self._hit("batch_share"); return 7  # noqa: E702
    def status(self): return "paced by test"
    def close(self): self._hit("close")


def _train(obs: Observer, steps: int) -> None:
    for _ in range(steps):
        with obs.step(samples=obs.batch_share(8)):
            with obs.phase("data"):
                time.sleep(0.001)
            with obs.collective("all_reduce", 64):
                time.sleep(0.0005)
            if obs.step_index == 2:
                junk = [[] for _ in range(100)]
                for j in junk:
                    j.append(j)
                gc.collect()


def test_single_process_run_is_recorded_and_complete(tmp_path):
    assert callable(fabricpace.observe) and fabricpace.Observer is Observer
    with fabricpace.observe(None, tmp_path / "r", window=5, config=CFG) as obs:
        _train(obs, 12)
    run = fabricpace.load_run(obs.run_dir)
    assert run.manifest.complete and not run.warnings, run.warnings
    assert run.manifest.source == "observer"
    assert run.steps["step"].to_list() == list(range(12))
    assert (run.steps["samples"] == 8).all()  # pacing off: equal split of 8 over 1 rank
    assert (run.steps["data_ns"] >= 1_000_000).all()
    assert (run.steps["t_end_ns"] > run.steps["t_start_ns"]).all()
    assert run.steps.filter(run.steps["step"] == 2)["gc_ns"].item() > 0
    assert (run.steps["wait_ns"] >= 500_000).all()  # blocking collective counts as wait
    assert run.collectives.height == 12 and set(run.collectives["op"]) == {"all_reduce"}
    assert set(run.ops["op"]) == {"data"}
    assert run.ranks.height == 1 and run.ranks["host"][0]
    assert (obs.run_dir / "windows.parquet").is_file()
    assert len(obs.window_history) == 2 and obs.failures == {}


def test_pacer_receives_hook_calls_and_sets_batch(tmp_path, capsys):
    pacer = Pacer()
    cfg = ObserverConfig(status_line=True, flush_every=4, flush_interval_s=0)
    with observe(None, tmp_path / "p", pacing=pacer, window=3, config=cfg) as obs:
        _train(obs, 6)
    assert pacer.calls.count("on_step_start") == pacer.calls.count("on_step_end") == 6
    assert pacer.calls.count("on_window") == 2 and pacer.calls[-1] == "close"
    assert len(pacer.last) == 1 and pacer.last[0].steps == 3
    run = fabricpace.load_run(obs.run_dir)
    assert (run.steps["samples"] == 7).all() and (run.steps["paced_ns"] == 500).all()
    err = capsys.readouterr().err
    assert err.count("fabricpace | window") == 2 and "paced by test" in err


@pytest.mark.parametrize("where", ["on_step_start", "on_window", "batch_share"])
def test_failing_pacer_is_dropped_training_continues(tmp_path, where, caplog):
    pacer = Pacer(fail_on=where)
    with observe(None, tmp_path / "f", pacing=pacer, window=2, config=CFG) as obs:
        _train(obs, 6)
    assert "pacing" in obs.failures
    assert pacer.calls.count(where) == 1  # never called again
    assert obs.batch_share(9) == 9
    assert sum("pacing disabled" in r.getMessage() for r in caplog.records) == 1
    assert fabricpace.load_run(obs.run_dir).steps.height == 6


@pytest.mark.parametrize("pacing", [["gc", "rebalance"], ("gc",), "gc,rebalance"])
def test_pacing_as_a_list_of_policies_builds_the_pacer(tmp_path, pacing):
    """The issue's own form, observe(model, pacing=["gc", "rebalance"]): before, a list was taken for a
    pacer object, failed at its first call and pacing was silently off."""
    with observe(None, tmp_path / "l", pacing=pacing, window=3, config=CFG) as obs:
        _train(obs, 6)
        assert obs.pacer.active and "pacing" not in obs.failures
    mode = pacing if isinstance(pacing, str) else ",".join(pacing)
    assert fabricpace.load_run(obs.run_dir).manifest.pacing["mode"] == mode


def test_unwritable_run_dir_degrades_to_no_writes(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with observe(None, blocker / "run", window=2, config=CFG) as obs:
        _train(obs, 9)
    assert "writing" in obs.failures
    assert len(obs.window_history) == 4  # summaries still computed (pacing keeps its input)
    assert sum("writing disabled" in r.getMessage() for r in caplog.records) == 1


def test_existing_run_dir_is_never_overwritten(tmp_path):
    target = tmp_path / "exp"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with observe(None, target, config=CFG) as obs:
        _train(obs, 2)
    assert obs.run_dir == tmp_path / "exp-1"
    assert (target / "keep.txt").read_text() == "mine" and not (target / "manifest.json").exists()


def test_a_broken_link_at_run_dir_is_kept_and_the_run_goes_next_to_it(tmp_path):
    # exists() calls a dangling symlink absent; writing there failed and the run recorded nothing.
    link = tmp_path / "exp"
    link.symlink_to(tmp_path / "nowhere")
    with observe(None, link, config=CFG) as obs:
        _train(obs, 2)
    assert obs.run_dir == tmp_path / "exp-1" and obs.failures == {}
    assert fabricpace.load_run(obs.run_dir).steps.height == 2
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize(("field", "value"), [
    ("window", 0), ("window", "50"), ("window", 2.5), ("window", True), ("flush_mode", "sometimes"),
    ("close_timeout_s", -3), ("gather_timeout_s", -1.0), ("store_timeout_s", 0),
    ("probe_timeout_s", float("nan")), ("flush_interval_s", -1), ("flush_max_steps", 10),
    ("gather_lag_steps", -1), ("status_line", "yes"), ("compact_parts", 1), ("compact_parts", -4),
    ("compact_parts", 8.0),
])  # fmt: skip
def test_bad_config_is_config_error_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=rf"^ObserverConfig\.{field} must"):
        ObserverConfig(**{field: value})


def test_config_accepts_numpy_integers_and_a_zero_interval():
    import numpy as np

    assert ObserverConfig(window=np.int64(5), flush_interval_s=0).window == 5


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"pacing": "autoo"}, "unknown policy 'autoo'"),
    ({"pacing": "gc,reblance"}, "unknown policy 'reblance'"),
    ({"pacing": True}, "pacing=True: use 'auto'"),
    ({"pacing": ["gc", 3]}, "a list of policy names"),
    ({"pacing": 42}, "nor a pacer object"),
    ({"config": {"window": 5}}, "got a dict"),
    ({"window": "50"}, "window must be a whole number"),
    ({"metrics_port": -1}, "a TCP port"),
])  # fmt: skip
def test_bad_observe_arguments_are_refused_before_anything_starts(tmp_path, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        observe(None, tmp_path / "run", **kwargs)
    assert not (tmp_path / "run").exists()  # nothing written, no thread left running


def test_pacing_off_forms_start_unpaced(tmp_path):
    for i, pacing in enumerate(["off", None, False, ""]):
        with observe(None, tmp_path / f"r{i}", config=CFG, pacing=pacing) as obs:
            _train(obs, 2)
        assert obs.failures == {}
    assert json.loads((tmp_path / "r1" / "manifest.json").read_text())["pacing"] == {"mode": "off"}


def test_observer_works_without_torch(tmp_path):
    code = f"""
import sys, json
sys.modules["torch"] = None  # make any torch import fail
import fabricpace
with fabricpace.observe(None, {str(tmp_path / 'nt')!r}) as obs:
    for _ in range(3):
        with obs.step(samples=1):
            pass
run = fabricpace.load_run(obs.run_dir)
has_torch = "torch" in sys.modules and sys.modules["torch"] is not None
print(json.dumps({{"steps": run.steps.height, "complete": run.manifest.complete,
                  "failures": obs.failures, "torch": has_torch}}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"steps": 3, "complete": True, "failures": {}, "torch": False}


def test_import_fabricpace_does_not_import_torch():
    code = "import sys, fabricpace; fabricpace.observe; fabricpace.Observer; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


def test_the_leaf_from_the_environment_reaches_ranks_parquet(tmp_path, monkeypatch):
    monkeypatch.setenv("FABRICPACE_LEAF", "leaf-a7")
    with fabricpace.observe(None, tmp_path / "r", window=5, config=CFG) as obs:
        _train(obs, 6)
    run = fabricpace.load_run(obs.run_dir)
    assert run.ranks["leaf"].to_list() == [0] and run.ranks["leaf_name"].to_list() == ["leaf-a7"]


def test_rank_rows_are_collected_within_one_timeout_in_all(launcher):
    # Ranks that never published their row (they never called observe) cost rank 0 one timeout in
    # all, not one each: 19 missing ranks at 0.3 s each used to hold it for 5.7 s.
    from types import SimpleNamespace

    torch = pytest.importorskip("torch")
    from fabricpace.observe.rank0_files import collect_ranks
    from fabricpace.observe.sidechannel import SideChannel

    _launch, free_port = launcher
    store = torch.distributed.TCPStore("127.0.0.1", free_port(), 1, True, wait_for_workers=False)
    channel = SideChannel(store, "t", 10.0)
    channel.set_json("rank/0", {"rank": 0, "host": "h"})
    fake = SimpleNamespace(world=20, channel=channel)
    t0 = time.monotonic()
    rows = collect_ranks(fake, "rank", 0.3)  # type: ignore[arg-type]
    took = time.monotonic() - t0
    assert rows[0]["host"] == "h" and rows[1:] == [{"rank": r} for r in range(1, 20)]
    assert took < 0.3 * 19 / 2


def test_window_summaries_reach_windows_parquet_in_parts_with_bounded_history(tmp_path):
    # 80 one-step windows: more than the in-memory history (64); windows.parquet must still hold every
    # window, and no part may be left behind.
    import polars as pl

    with observe(None, tmp_path / "run", window=1, config=CFG) as obs:
        for _ in range(80):
            with obs.step(samples=8):
                pass
    w = pl.read_parquet(obs.run_dir / "windows.parquet")
    assert w["window"].to_list() == list(range(80)) and w["rank"].to_list() == [0] * 80
    assert w.schema["steps"] == pl.Int64 and w.schema["step_mean_ns"] == pl.Float64
    assert not (obs.run_dir / "windows").exists()
    assert len(obs.window_history) == 64


def test_window_log_writes_parts_and_joins_them_at_close(tmp_path):
    # Parts as a 2,048-rank job writes them (here every 10 rows of a 3-rank job), joined in order.
    import polars as pl

    from fabricpace.observe._guard import Guard
    from fabricpace.observe.chunks import ChunkSink
    from fabricpace.observe.window_log import WindowLog
    from fabricpace.run.window import WindowSummary

    sink = ChunkSink(tmp_path, 0, Guard(0), threaded=True)
    log = WindowLog(sink, part_rows=10)
    fields = {f: 0.0 for f in WindowSummary.__dataclass_fields__ if f not in ("rank", "window")}
    fields.update(first_step=0, steps=1)
    for w in range(20):
        log.add([WindowSummary(**{**fields, "rank": r, "window": w, "step_mean_ns": w * 10.0 + r})
                 for r in range(3)])
    assert sink.close(10.0)
    assert len(list((tmp_path / "windows").glob("rank-*/part-*.parquet"))) == 5  # 4 windows (12 rows) each
    log.finish(tmp_path)
    w = pl.read_parquet(tmp_path / "windows.parquet")
    assert w["step_mean_ns"].to_list() == [x * 10.0 + r for x in range(20) for r in range(3)]
    assert not (tmp_path / "windows").exists()


def test_an_explicit_run_dir_that_differs_from_the_launchers_is_named(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("FABRICPACE_RUN_DIR", str(tmp_path / "launcher"))
    with observe(None, tmp_path / "script", config=CFG) as obs:
        _train(obs, 2)
    assert obs.run_dir == tmp_path / "script"
    assert sum("wins over FABRICPACE_RUN_DIR" in r.getMessage() for r in caplog.records) == 1
    caplog.clear()
    with observe(None, None, config=CFG) as obs:
        _train(obs, 2)
    assert obs.run_dir == tmp_path / "launcher" and not caplog.records


def test_a_step_ended_by_the_users_own_error_is_written_one_ended_by_torchs_is_not(tmp_path):
    with observe(None, tmp_path / "r", config=CFG) as obs:
        for err in [None, ValueError("bad batch"), None, RuntimeError("peer gone"), None]:
            try:
                with obs.step(samples=2):
                    if err is not None:
                        raise err
            except (ValueError, RuntimeError):
                pass
    data = fabricpace.load_run(obs.run_dir)
    assert data.steps["step"].to_list() == [0, 1, 2, 4] and obs.failed_steps == [3]
    assert data.manifest.extra["failed_steps"] == [3] and data.manifest.complete
