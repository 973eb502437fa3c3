"""Hook-free DDP instrumentation (``ddp_probe``): mode choice, bucket layout, no_sync, on real gloo."""

from __future__ import annotations

import pytest

from fabricpace._errors import ConfigError
from fabricpace.observe import ObserverConfig
from fabricpace.observe.ddp_probe import choose_mode, parse_bucket_indices

CFG = ObserverConfig(status_line=False, flush_mode="main")


class _Wants:
    def wants_comm_hook(self) -> bool:
        return False


class _NoWants:
    def before_bucket(self, i: int) -> None: ...


@pytest.mark.parametrize(
    ("setting", "user_hook", "pacing", "pacer", "expected"),
    [
        ("auto", False, "off", None, ("grad_hooks", False)),
        ("auto", True, "off", None, ("hook", False)),  # a user hook is wrapped by the comm hook
        ("auto", False, "gc,comm", _Wants(), ("hook", False)),  # comm named explicitly
        ("auto", False, ["comm"], _Wants(), ("hook", False)),
        ("auto", False, "auto", _Wants(), ("grad_hooks", True)),  # lazy: install when asked
        ("auto", False, "gc", _Wants(), ("grad_hooks", True)),
        ("auto", False, "auto", _NoWants(), ("hook", False)),  # cannot say when: hook from the start
        ("auto", False, "gc,rebalance", _NoWants(), ("grad_hooks", False)),
        ("auto", False, _NoWants(), _NoWants(), ("hook", False)),  # a custom pacer object
        ("hook", False, "off", None, ("hook", False)),
        ("grad_hooks", True, "gc,comm", _NoWants(), ("grad_hooks", False)),  # explicit choice wins
    ],
)
def test_mode_choice(setting, user_hook, pacing, pacer, expected):
    assert choose_mode(setting, user_hook=user_hook, pacing=pacing, pacer=pacer) == expected


def test_the_real_pacer_starts_hook_free_in_auto(tmp_path):
    from fabricpace.pacing import make_pacer

    pacer = make_pacer("auto", rank=0, world_size=2, run_dir=None, window=10)
    assert pacer.wants_comm_hook() is False  # nothing triggered yet
    assert choose_mode("auto", user_hook=False, pacing="auto", pacer=pacer) == ("grad_hooks", True)


def test_bad_instrumentation_setting_is_a_config_error():
    with pytest.raises(ConfigError, match="ddp_instrumentation"):
        ObserverConfig(ddp_instrumentation="hooks")


def test_bucket_index_text_parses():
    assert parse_bucket_indices("5 4 3 2, 1 0") == [[5, 4, 3, 2], [1, 0]]
    assert parse_bucket_indices("") == []


torch = pytest.importorskip("torch")


def _ddp(**kw):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                              torch.nn.ReLU(), torch.nn.Linear(64, 4))
    return torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.005, **kw)


def _reducer_layout(model, params):  # type: ignore[no-untyped-def]
    """The buckets DDP really reduces (test-only: allocates a zero copy of every bucket)."""
    index = {id(p): i for i, p in enumerate(params)}
    return [[index[id(p)] for p in b.parameters()] for b in model.reducer._get_zeros_like_grad_buckets()]


@pytest.mark.parametrize("find_unused", [False, True])
def test_learned_layout_is_ddps_and_one_hook_per_bucket_remains(gloo_world1, tmp_path, find_unused):
    from fabricpace import load_run
    from fabricpace.observe import observe

    model = _ddp(find_unused_parameters=find_unused)
    with observe(model, tmp_path / "r", config=CFG) as obs:
        for _ in range(5):
            with obs.step(samples=4):
                model(torch.randn(4, 16)).sum().backward()
        probe = obs._probe
        assert obs.ddp_mode == "grad_hooks" and not probe.learning
        assert probe.buckets == _reducer_layout(model, probe.params)
        assert len(probe.buckets) >= 2 and len(probe._handles) == len(probe.buckets)
        # Bucket sizes as DDP's comm hook would see them (bytes of the flat bucket).
        real = model.reducer._get_zeros_like_grad_buckets()
        assert probe.bucket_bytes == [b.buffer().numel() * b.buffer().element_size() for b in real]
    assert obs.failures == {} and probe._handles == []  # closing removed every hook
    c = load_run(obs.run_dir).collectives
    first = 0 if find_unused else 2  # no rebuild with find_unused_parameters: layout known at step 0
    assert sorted(set(c["step"])) == list(range(first, 5))
    assert c.height == (5 - first) * len(probe.buckets)


def test_no_sync_backwards_are_not_recorded(gloo_world1, tmp_path):
    from fabricpace import load_run
    from fabricpace.observe import observe

    model = _ddp()
    with observe(model, tmp_path / "r", config=CFG) as obs:
        for _ in range(5):
            with obs.step(samples=8):
                with model.no_sync():  # gradient accumulation: nothing is reduced here
                    model(torch.randn(4, 16)).sum().backward()
                model(torch.randn(4, 16)).sum().backward()
        buckets = len(obs._probe.buckets)
    c = load_run(obs.run_dir).collectives
    per_step = c.group_by("step").len()
    # One synchronized backward per step: each bucket once, not twice (learning may end a step
    # earlier than without no_sync, as every forward refreshes DDP's logging data).
    assert per_step.height >= 3 and (per_step["len"] == buckets).all()


def test_explicit_grad_hooks_registers_a_user_hook_unwrapped(gloo_world1, tmp_path):
    from fabricpace.observe import observe

    def double_hook(state, bucket):  # type: ignore[no-untyped-def]
        buf = bucket.buffer()
        buf.mul_(2.0)
        return torch.distributed.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])

    plain, model = _ddp(), _ddp()
    x = torch.randn(8, 16)
    plain(x).sum().backward()
    cfg = ObserverConfig(status_line=False, flush_mode="main", ddp_instrumentation="grad_hooks")
    with observe(model, tmp_path / "u", comm_hook=(None, double_hook), config=cfg) as obs, obs.step():
        model(x).sum().backward()
    assert obs.ddp_mode == "grad_hooks" and obs.failures == {}
    for p, q in zip(plain.parameters(), model.parameters(), strict=True):
        assert torch.equal(q.grad, 2.0 * p.grad)


def test_a_module_that_is_not_ddp_is_reported_once(tmp_path):
    from fabricpace.observe import observe

    with observe(torch.nn.Linear(2, 2), tmp_path / "n", config=CFG) as obs, obs.step():
        pass
    assert "ddp probe" in obs.failures and obs.ddp_mode is None


def test_a_failing_probe_never_breaks_backward(gloo_world1, tmp_path, caplog):
    from fabricpace.observe import observe

    model = _ddp()
    plain = _ddp()
    with observe(model, tmp_path / "f", config=CFG) as obs:
        for i in range(6):
            if i == 3:  # the clock read inside the bucket hooks starts raising (autograd thread)
                def broken() -> int:
                    raise RuntimeError("probe bug")

                probe = obs._probe
                probe.mark = broken
                probe._handles[0].remove()  # re-register bucket 0's hook so that it binds the broken clock
                param = probe.params[probe.kept[0]]
                hook = probe._bucket_hook(0, probe._stamps)
                probe._handles[0] = param.register_post_accumulate_grad_hook(hook)
            x = torch.randn(4, 16)
            with obs.step(samples=4):
                model.zero_grad()
                model(x).sum().backward()
            plain.zero_grad()
            plain(x).sum().backward()
            assert all(torch.equal(p.grad, q.grad) for p, q in zip(plain.parameters(), model.parameters(),
                                                                  strict=True))
        assert obs._probe is None  # removed at the step end after the failure
    assert "ddp probe" in obs.failures and "recording" not in obs.failures
    assert sum("ddp probe disabled" in r.getMessage() for r in caplog.records) == 1


def test_side_channel_waits_do_not_block_the_jobs_store(gloo_world1):
    """The observer's Store is its own TCPStore connection: a background wait (clock thread) does
    not hold the lock of the job's client, which torch's TCPStore keeps for the whole wait."""
    import threading
    import time
    from datetime import timedelta

    from torch.distributed import distributed_c10d

    from fabricpace.observe.sidechannel import default_store

    shared = distributed_c10d._get_default_store()
    private = default_store()
    assert private is not shared

    def main_thread_op_seconds(waiting_on) -> float:  # type: ignore[no-untyped-def]
        def wait() -> None:
            with pytest.raises(Exception):  # noqa: B017 (torch raises DistStoreError on timeout)
                waiting_on.wait(["never-set"], timedelta(seconds=1.0))

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.1)
        t0 = time.perf_counter()
        shared.set("job-key", "1")
        shared.get("job-key")
        took = time.perf_counter() - t0
        t.join()
        return took

    assert main_thread_op_seconds(private) < 0.5
    assert main_thread_op_seconds(shared) > 0.5  # why: the shared client would have stalled it


def test_event_timeline_probe_records_like_the_host_clock_path(gloo_world1, tmp_path):
    # The CUDA path (stamps are device events resolved later) keeps per-collective records; the host
    # path appends whole backwards to a flat round buffer. Same rows (fake device, no GPU here).
    from fabricpace import load_run
    from fabricpace.observe import Observer
    from fabricpace.observe.clocks import CpuClock, FakeEventSource

    runs = {}
    for name, source in (("host", None), ("events", FakeEventSource(CpuClock().now, lag_ns=200_000))):
        model = _ddp()
        obs = Observer(model, tmp_path / name, config=CFG, event_source=source)
        with obs:
            for _ in range(6):
                with obs.step(samples=4):
                    model(torch.randn(4, 16)).sum().backward()
            assert obs._probe._flat is (source is None)
        assert obs.failures == {}
        runs[name] = load_run(obs.run_dir)
    host, events = runs["host"], runs["events"]
    assert host.steps.height == events.steps.height == 6
    cols = ["step", "seq", "group", "op", "bytes"]
    assert host.collectives.select(cols).equals(events.collectives.select(cols))
    last = host.collectives.filter(host.collectives["t_exit_ns"] > host.collectives["t_enter_ns"])
    assert last.height == 4 and (host.steps.filter(host.steps["step"] >= 2)["comm_ns"] > 0).all()


def test_probe_rearms_when_a_backwards_final_callbacks_never_ran(gloo_world1, tmp_path):
    # A backward that raised after a bucket hook fired leaves the probe "armed" with no final
    # callback to come (DDP itself cannot continue after that, but the probe must not go silent
    # if the job does): the step end notices and re-arms, so later backwards are recorded again.
    from fabricpace import load_run
    from fabricpace.observe import observe

    model = _ddp()
    with observe(model, tmp_path / "r", config=CFG) as obs:
        for step in range(8):
            with obs.step(samples=4):
                model(torch.randn(4, 16)).sum().backward()
                if step == 4:
                    obs._probe.armed[0] = True  # as if this backward's callbacks never ran
        buckets = len(obs._probe.buckets)
        assert obs._probe.armed[0] is False
    per_step = load_run(obs.run_dir).collectives.group_by("step").len().sort("step")
    assert per_step["step"].to_list() == [2, 3, 4, 5, 6, 7]
    assert (per_step["len"] == buckets).all()


def test_long_windows_keep_every_round(gloo_world1, tmp_path):
    # Rounds wait in the flat buffer until a window closes or a chunk is flushed: a window longer
    # than the per-step round bound (64) must not drop any.
    from fabricpace import load_run
    from fabricpace.observe import observe

    model = _ddp()
    cfg = ObserverConfig(status_line=False, flush_mode="main", window=150, flush_every=150,
                         flush_interval_s=0)
    with observe(model, tmp_path / "r", config=cfg) as obs:
        for _ in range(160):
            with obs.step(samples=4):
                model(torch.randn(4, 16)).sum().backward()
        buckets = len(obs._probe.buckets)
    c = load_run(obs.run_dir).collectives
    assert sorted(set(c["step"])) == list(range(2, 160))
    assert c.height == 158 * buckets
