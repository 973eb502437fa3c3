"""At close, steps whose collective never got its completion stamp are written (exit unknown), not
dropped. No GPU here: ``FakeEventSource`` stands in for CUDA events (device work runs a fixed lag after
the host enqueues it); the real events are checked by benchmarks/gpu_check.py on a GPU."""

from __future__ import annotations

from fabricpace import load_run
from fabricpace.observe import Observer, ObserverConfig
from fabricpace.observe.clocks import CpuClock, FakeEventSource

CFG = ObserverConfig(status_line=False, flush_mode="main")


def test_close_writes_steps_whose_collective_exit_never_came(tmp_path):
    obs = Observer(None, tmp_path / "run", config=CFG, event_source=FakeEventSource(CpuClock().now, 100_000))
    with obs:
        for i in range(5):
            with obs.step(samples=4):
                rec = obs.recorder.enter("world", "all_reduce", 1024, False)
                if i < 3:
                    obs.recorder.exit(rec)  # steps 3 and 4: the completion callback never ran
    assert obs.failures == {}
    run = load_run(obs.run_dir)
    assert run.steps["step"].to_list() == [0, 1, 2, 3, 4]
    exits = run.collectives.sort("step")["t_exit_ns"].to_list()
    assert [e is None for e in exits] == [False, False, False, True, True]
