"""How the observer watches DDP's gradient buckets: hook-free (``ddp_probe``), through a comm hook
(``hooks.wrap_hook``), or hook-free first and the comm hook later, once, when the pacer asks for
bucket calls (``ObserverConfig.ddp_instrumentation``; docs/observer.md, "DDP instrumentation modes").

Functions of the ``Observer`` they instrument (its guard, pacer, recorder and DDP state).
"""

from __future__ import annotations

from typing import Any

from fabricpace.observe._guard import LOG


def unwrap(model: Any) -> Any:
    """The module ``torch.compile`` compiled (an ``OptimizedModule`` keeps it as ``_orig_mod``): for
    ``torch.compile(DDP(net))`` the DDP module, whose reducer and parameters are the real ones."""
    inner = getattr(model, "_orig_mod", None)
    return inner if inner is not None and hasattr(inner, "parameters") else model


def model_kind(model: Any) -> str:
    """"ddp" (a DistributedDataParallel module), "fsdp2" (a ``fully_shard`` module) or "other"."""
    if getattr(model, "reducer", None) is not None and hasattr(model, "module"):
        return "ddp"
    try:
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule):
            return "fsdp2"
    except Exception:  # an older torch without FSDP2
        pass
    return "other"


def explain_model(obs: Any, model: Any, kind: str, wrap_collectives: bool, comm_hook: Any) -> bool:
    """A model that is not DDP: say once what is recorded instead; returns ``wrap_collectives``.

    FSDP2 reduces through plain torch.distributed collectives (all_gather_single,
    reduce_scatter_single), so its collectives are recorded through the collective wrapper, switched
    on here. Any other module has no buckets to watch: steps are recorded, collectives only with
    ``wrap_collectives=True`` or ``obs.collective``."""
    name = type(model).__name__
    if kind == "fsdp2":
        if not wrap_collectives and obs.rank == 0:
            LOG.info("fabricpace observer: %s is an FSDP2 (fully_shard) module; recording its collectives "
                     "(wrap_collectives=True)", name)
        wrap_collectives = True
    else:  # logged once by the guard, and named in the manifest's observer_failures
        _tell_buckets(obs, 0)  # no DDP buckets: the comm gate has nothing to hold
        hint = "" if wrap_collectives else " (wrap_collectives=True records torch.distributed collectives)"
        obs.guard.fail("ddp probe", f"model is a {name}, not DistributedDataParallel: no DDP bucket rows, "
                       f"steps are recorded{hint}")
    if comm_hook is not None:
        obs.guard.fail("comm hook", f"comm_hook needs a DistributedDataParallel model (got {name})")
    return wrap_collectives


def instrument_ddp(obs: Any, model: Any, comm_hook: tuple[Any, Any] | None, pacing: Any) -> None:
    """Observe DDP's buckets through a comm hook or hook-free (``ddp_probe``); see config."""
    from fabricpace.observe.collectives import group_name
    from fabricpace.observe.ddp_probe import GradHookProbe, choose_mode

    mode, lazy = choose_mode(obs.config.ddp_instrumentation, user_hook=comm_hook is not None,
                             pacing=pacing, pacer=obs.pacer.pacer)
    if lazy and obs.pacer.wants_comm_hook():
        mode, lazy = "hook", False
    if mode == "hook":
        install_hook(obs, model, comm_hook)
        return
    if obs.pacer.active and not lazy and obs.config.ddp_instrumentation == "grad_hooks":
        LOG.warning("fabricpace observer: ddp_instrumentation='grad_hooks': the pacer gets no "
                    "before_bucket/after_bucket calls (comm pacing cannot act)")
    pg = getattr(model, "process_group", None)
    try:
        obs._probe = GradHookProbe(obs, model, "ddp:" + group_name(pg))
        obs.ddp_mode = "grad_hooks"
        obs._lazy_hook = lazy
        obs._ddp_args = (model, comm_hook)
    except Exception as exc:
        obs.guard.fail("ddp probe", exc)
    if comm_hook is not None:  # explicit grad_hooks with a user hook: DDP runs it unwrapped
        try:
            model.register_comm_hook(comm_hook[0], comm_hook[1])
        except Exception as exc:
            obs.guard.fail("comm hook", exc)


def watch_join(obs: Any, model: Any) -> Any:
    """Let the observer know when this rank joins under DDP's ``Join`` context (uneven inputs).

    A rank whose inputs ran out stays inside ``Join.__exit__`` — shadowing the others' all-reduces
    through DDP's join hook — until every rank is done, so its observer stays open and takes no
    step: its peers' next window gather could never complete and held their training for
    ``gather_timeout_s``. ``Join([model])`` asks the model for its hook when it is built; the wrapper
    put on this DDP instance calls ``obs._joined()`` once, at the first shadowing round, and then
    DDP's own hook unchanged. Returns an undo function (None when the model has no ``join_hook``)."""
    original = getattr(model, "join_hook", None)
    if original is None:
        return None

    def join_hook(**kwargs: Any) -> Any:
        hook = original(**kwargs)
        try:
            main = hook.main_hook

            def main_hook() -> None:
                obs._joined()  # never raises
                main()

            hook.main_hook = main_hook
        except Exception as exc:  # DDP's hook is used unwrapped
            obs.guard.fail("join", exc)
        return hook

    model.__dict__["join_hook"] = join_hook  # shadows the method on this instance only

    def undo() -> None:
        if model.__dict__.get("join_hook") is join_hook:
            del model.__dict__["join_hook"]

    return undo


def install_hook(obs: Any, model: Any, comm_hook: tuple[Any, Any] | None) -> bool:
    """Register the observer's comm hook (wrapping the user's, if any); False when DDP refused it."""
    from fabricpace.observe.collectives import group_name
    from fabricpace.observe.hooks import wrap_hook

    pg = getattr(model, "process_group", None)
    state, hook = comm_hook if comm_hook is not None else (None, None)
    try:
        model.register_comm_hook(
            None, wrap_hook(obs, user_hook=hook, user_state=state, process_group=pg,
                            group_name="ddp:" + group_name(pg))
        )
    except Exception as exc:
        # E.g. a hook was already registered: steps are still recorded, buckets are not.
        obs.guard.fail("comm hook", exc)
        return False
    obs.ddp_mode = "hook"
    return True


def _tell_buckets(obs: Any, n: int | None) -> None:
    """Give the pacer DDP's bucket count (the comm gate cannot act with no more buckets than its
    window); pacers without ``set_comm_buckets`` are not asked."""
    pacer = obs.pacer.pacer
    fn = getattr(pacer, "set_comm_buckets", None) if pacer is not None else None
    if fn is None or n is None:
        return
    try:
        fn(n)
    except Exception as exc:
        obs.pacer.drop(f"set_comm_buckets failed: {exc!r}")


def bucket_count(obs: Any, model: Any) -> int | None:
    """DDP's bucket count once its layout is fixed (the same on every rank: rank 0's layout is
    broadcast), else None; from the hook-free probe, or from DDP's logging data."""
    probe = obs._probe
    buckets = getattr(probe, "buckets", None) if probe is not None else None
    if buckets:
        return len(buckets)
    try:
        from fabricpace.observe.ddp_probe import initial_buckets, parse_bucket_indices, reducer_params

        if model.find_unused_parameters and not getattr(model, "static_graph", False):
            layout = initial_buckets(model, reducer_params(model))  # (DDP never rebuilds)
            return len(layout) if layout else None
        data = model._get_ddp_logging_data()
        if int(data.get("has_rebuilt_buckets", 0) or 0):
            return len(parse_bucket_indices(data.get("rebuilt_per_bucket_param_indices", ""))) or None
    except Exception:  # private helpers changed: the count stays unknown (no limit on comm)
        return None
    return None


def maybe_install_hook(obs: Any) -> None:
    """Lazy mode: after a window, install the comm hook once the pacer asks for bucket calls.
    Runs between steps at the same step on every rank (the pacer decides from the same gathered
    summaries), so the bucket sequence numbers stay aligned; DDP accepts one hook, kept for good.
    First the pacer learns DDP's bucket count, once known (comm is not tried with too few buckets)."""
    if getattr(obs, "_ddp_buckets", None) is None and obs.pacer.active:
        obs._ddp_buckets = bucket_count(obs, obs._ddp_args[0])
        _tell_buckets(obs, obs._ddp_buckets)
    if not obs.pacer.wants_comm_hook():
        if not obs.pacer.active:
            obs._lazy_hook = False  # pacing was dropped: nothing will ask any more
        return
    obs._lazy_hook = False
    model, comm_hook = obs._ddp_args
    # The probe's pending rounds take their sequence numbers first, so the hook's records continue them.
    obs.recorder.drain()
    if install_hook(obs, model, comm_hook):
        obs._remove_probe()
        obs.comm_hook_step = obs.step_index
        if obs.rank == 0:
            LOG.info("fabricpace observer: pacer asked for bucket calls; DDP comm hook installed "
                     "after step %d", obs.step_index)
