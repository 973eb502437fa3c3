"""The DDP comm hook wrapper and the collective wrapper on a real one-rank gloo group."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = torch.distributed

from fabricpace.observe import ObserverConfig, observe  # noqa: E402

CFG = ObserverConfig(status_line=False, flush_mode="main")
HOOK = ObserverConfig(status_line=False, flush_mode="main", ddp_instrumentation="hook")


def _ddp():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    return torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.005)


def test_user_hook_is_wrapped_and_still_decides_the_reduction(gloo_world1, tmp_path):
    seen = []

    def double_hook(state, bucket):
        seen.append(bucket.index())
        buf = bucket.buffer()
        buf.mul_(2.0)  # a user hook that changes the result: the wrapper must keep that
        return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])

    plain = _ddp()
    model = _ddp()
    x = torch.randn(8, 16)
    plain(x).sum().backward()
    # A user hook selects the comm-hook mode under the default "auto".
    with observe(model, tmp_path / "h", comm_hook=("state", double_hook), config=CFG) as obs:
        for _ in range(3):
            with obs.step(samples=8):
                model.zero_grad()
                model(x).sum().backward()
    assert seen and obs.failures == {}
    for p, q in zip(plain.parameters(), model.parameters(), strict=True):
        assert torch.equal(q.grad, 2.0 * p.grad)
    import fabricpace

    run = fabricpace.load_run(obs.run_dir)
    c = run.collectives
    assert c.height == 3 * len(set(seen)) and set(c["group"]) == {"ddp:world"}
    assert (c["t_exit_ns"] >= c["t_enter_ns"]).all() and (c["bytes"] > 0).all()


def test_already_registered_hook_is_reported_not_fatal(gloo_world1, tmp_path, caplog):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = _ddp()
    model.register_comm_hook(None, default_hooks.allreduce_hook)
    with observe(model, tmp_path / "x", config=HOOK) as obs, obs.step(samples=1):
        model(torch.randn(2, 16)).sum().backward()
    assert "comm hook" in obs.failures
    assert sum("comm hook disabled" in r.getMessage() for r in caplog.records) == 1


def test_hook_free_default_observes_a_model_with_its_own_hook(gloo_world1, tmp_path):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = _ddp()
    model.register_comm_hook(None, default_hooks.allreduce_hook)  # the user's, registered by the user
    with observe(model, tmp_path / "own", config=CFG) as obs:
        for _ in range(5):
            with obs.step(samples=2):
                model(torch.randn(2, 16)).sum().backward()
    assert obs.failures == {} and obs.ddp_mode == "grad_hooks"
    import fabricpace

    c = fabricpace.load_run(obs.run_dir).collectives
    buckets = len(model.reducer._get_zeros_like_grad_buckets())
    assert sorted(set(c["step"])) == [2, 3, 4] and c.height == 3 * buckets


def test_collective_wrapper_records_and_restores(gloo_world1, tmp_path):
    original = dist.all_reduce
    with observe(None, tmp_path / "w", wrap_collectives=True, config=CFG) as obs:
        assert dist.all_reduce is not original
        for _ in range(2):
            with obs.step():
                t = torch.ones(8)
                dist.all_reduce(t)
                dist.all_reduce(t, async_op=True).wait()
                dist.broadcast(t, 0)
    assert dist.all_reduce is original
    import fabricpace

    c = fabricpace.load_run(obs.run_dir).collectives
    assert sorted(set(c["op"])) == ["all_reduce", "broadcast"]
    assert c.height == 6 and (c["bytes"] == 32).all()
    assert c["seq"].to_list() == list(range(6))


def test_hook_torch_refuses_is_refused_as_without_the_observer(gloo_world1, tmp_path):
    """DDP refuses bf16_compress_hook without NCCL (its _check_comm_hook tests the hook's __name__).
    Passed as comm_hook= it must fail the same way, from observe(), before anything starts (before:
    the wrapper, named 'hook', passed the check and the job ran only while observed)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

    with pytest.raises(TypeError) as plain:
        _ddp().register_comm_hook(None, bf16_compress_hook)
    model = _ddp()
    with pytest.raises(TypeError) as observed:
        observe(model, tmp_path / "bf16", comm_hook=(None, bf16_compress_hook), config=CFG)
    assert str(observed.value) == str(plain.value)
    assert not (tmp_path / "bf16").exists()  # nothing started


def test_wrapped_hook_carries_the_user_hooks_name(gloo_world1, tmp_path):
    """DDP sees (and logs) the user's hook through the observer's wrapper: name, qualname and
    signature are the user's, as when the user registers it without the observer."""
    import inspect

    from fabricpace.observe.hooks import wrap_hook

    def my_hook(state, bucket):  # type: ignore[no-untyped-def]
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

    plain = _ddp()
    plain.register_comm_hook(None, my_hook)
    model = _ddp()
    with observe(model, tmp_path / "n", comm_hook=(None, my_hook), config=CFG) as obs, obs.step(samples=8):
        model(torch.randn(8, 16)).sum().backward()
    assert obs.failures == {} and obs.ddp_mode == "hook"
    assert model._get_ddp_logging_data()["comm_hook"] == plain._get_ddp_logging_data()["comm_hook"]
    wrapped = wrap_hook(obs, user_hook=my_hook, user_state=None, process_group=None, group_name="x")
    assert wrapped.__name__ == "my_hook" and inspect.signature(wrapped) == inspect.signature(my_hook)


def test_a_patch_over_the_wrapper_survives_and_calls_are_recorded_once(gloo_world1, tmp_path):
    """Another tool patches dist.all_reduce over the observer's wrapper: closing the observer keeps
    that patch (the old uninstall put the original back over it), the wrapper left in its chain
    only passes calls through, and a later observer records each call once."""
    import fabricpace

    original = dist.all_reduce
    with observe(None, tmp_path / "a", wrap_collectives=True, config=CFG):
        ours = dist.all_reduce

        def patch(*args, **kwargs):  # type: ignore[no-untyped-def]
            return ours(*args, **kwargs)

        dist.all_reduce = patch
    try:
        assert dist.all_reduce is patch
        with observe(None, tmp_path / "b", wrap_collectives=True, config=CFG) as obs:
            for _ in range(2):
                with obs.step():
                    dist.all_reduce(torch.ones(4))
        assert dist.all_reduce is patch
        assert fabricpace.load_run(obs.run_dir).collectives.height == 2
    finally:
        dist.all_reduce = original
    with observe(None, tmp_path / "c", wrap_collectives=True, config=CFG) as obs, obs.step():
        dist.all_reduce(torch.ones(4))
    assert dist.all_reduce is original
    assert fabricpace.load_run(obs.run_dir).collectives.height == 1
