"""How the observer watches DDP's gradient buckets: hook-free (``ddp_probe``), through a comm hook
(``hooks.wrap_hook``), or hook-free first and the comm hook only while the pacer asks for bucket calls
(``ObserverConfig.ddp_instrumentation``; docs/observer.md, "DDP instrumentation modes").

Lazy mode: the comm hook is installed between steps when ``wants_comm_hook()`` turns True. A pacer that
says ``comm_hook_removable`` (the real one) is asked after every window, and once it says False again
(its comm trial was reverted) the hook is removed: DDP accepts one ``register_comm_hook`` per reducer
and has no way to unregister it, so the reducer is rebuilt without the hook, the way DDP itself
rebuilds it when it is unpickled (``DistributedDataParallel.__setstate__``), and the hook-free probe
resumes. Where that rebuild is not safe (another comm hook, ``static_graph``, DDP's mixed precision, a
compiled model, a torch without those methods) the hook stays registered but passes every bucket
straight to the all-reduce (no recording, no pacer call) and the probe resumes: what remains is the
price of any Python comm hook. Either way the pacer is told (``comm_hook_changed``).

Functions of the ``Observer`` they instrument (its guard, pacer, recorder and DDP state).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
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


class LazyHook:
    """The comm hook of the lazy mode, as registered on one DDP reducer: it observes each bucket
    (``hooks.wrap_hook``: stamps, pacer calls) while ``observing``, else passes it straight to the same
    all-reduce (the pass-through left behind when the reducer cannot be rebuilt without it)."""

    def __init__(self, obs: Any, model: Any) -> None:
        from fabricpace.observe.collectives import group_name
        from fabricpace.observe.hooks import _value, default_allreduce, wrap_hook

        pg = getattr(model, "process_group", None)
        observed = wrap_hook(obs, user_hook=None, user_state=None, process_group=pg,
                             group_name="ddp:" + group_name(pg))
        plain = default_allreduce(pg)
        self.model = model
        self.reducer = getattr(model, "reducer", None)
        self.observing = True
        switch = self

        # DDP reads the hook's signature (a "bucket" parameter, no foreign annotations) and its name.
        def hook(_state, bucket):  # type: ignore[no-untyped-def]
            if switch.observing:
                return observed(_state, bucket)
            return plain(_state, bucket).then(_value)

        self.hook: Callable[[Any, Any], Any] = hook

    def register(self) -> None:
        self.model.register_comm_hook(None, self.hook)


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
    """Lazy mode, after each window (at the same step on every rank: the pacer decides from the same
    gathered summaries, so the bucket sequence numbers stay aligned): tell the pacer DDP's bucket
    count, install the comm hook when the pacer asks for bucket calls, and — for a pacer that says
    ``comm_hook_removable`` — remove it once it no longer asks. Other pacers keep the hook for good and
    are not asked again (the earlier contract)."""
    model, _ = obs._ddp_args
    hook: LazyHook | None = getattr(obs, "_lazy", None)
    observing = hook is not None and hook.observing
    # Pacing can go off on one rank before the others learn it (its own error, its controller's time
    # limit): the hook then only becomes a pass-through there. A reducer rebuild must happen on every
    # rank at the same step (the new reducer's first forward broadcasts its bucket layout), so only
    # a removal that the ranks decided together from the gathered summaries rebuilds.
    if not obs.pacer.active:
        if observing:  # pacing went off: nothing will gate, and the hook's recording costs
            remove_hook(obs, "pacing went off", rebuild=False)
        obs._lazy_hook = False
        return
    if getattr(obs, "_ddp_buckets", None) is None:
        obs._ddp_buckets = bucket_count(obs, model)
        _tell_buckets(obs, obs._ddp_buckets)
    wants = obs.pacer.wants_comm_hook()
    if not obs.pacer.active:  # (the call failed and dropped the pacer)
        if observing:
            remove_hook(obs, "pacing went off", rebuild=False)
        obs._lazy_hook = False
        return
    removable = bool(getattr(obs.pacer.pacer, "comm_hook_removable", False))
    if wants and not observing:
        _install_lazy(obs, model)
        if not removable:
            obs._lazy_hook = False
    elif not wants and observing and removable:
        agreed = bool(getattr(obs.pacer.pacer, "enabled", True)) and not obs.pacer.failed_here
        remove_hook(obs, "the pacer no longer gates bucket launches" if agreed else "pacing went off",
                    rebuild=agreed)


def _install_lazy(obs: Any, model: Any) -> None:
    # The probe's pending rounds take their sequence numbers first, so the hook's records continue them.
    obs.recorder.drain()
    hook: LazyHook | None = getattr(obs, "_lazy", None)
    if hook is not None and hook.reducer is not None and hook.reducer is getattr(model, "reducer", None):
        hook.observing = True  # still registered as a pass-through on this reducer
        how = "observing again (it had stayed registered as a pass-through)"
    else:
        try:
            hook = LazyHook(obs, model)
            hook.register()
        except Exception as exc:  # e.g. a hook was already registered: steps are still recorded
            obs.guard.fail("comm hook", exc)
            obs._lazy_hook = False
            return
        obs._lazy = hook
        how = "its Python callback runs for every bucket of every step while comm gates or is on trial"
    obs._remove_probe()
    obs.ddp_mode = "hook"
    obs.comm_hook_step = obs.step_index
    _tell_pacer(obs, True, how)
    if obs.rank == 0:
        LOG.info("fabricpace observer: pacer asked for bucket calls; DDP comm hook installed "
                 "after step %d", obs.step_index)


def remove_hook(obs: Any, why: str, *, rebuild: bool) -> None:
    """Stop observing through the lazily installed comm hook: rebuild DDP's reducer without it (only
    with ``rebuild``: every rank removes it at this step; and where that is safe), else leave it as a
    pass-through, and resume the hook-free probe."""
    from fabricpace.observe.collectives import group_name
    from fabricpace.observe.ddp_probe import GradHookProbe

    hook: LazyHook | None = getattr(obs, "_lazy", None)
    if hook is None:
        return
    model = hook.model
    # The hook's records of ended steps take their sequence numbers first; the probe continues them.
    obs.recorder.drain()
    hook.observing = False  # from now on a pass-through, whatever happens below
    not_safe = (rebuild_blocker(obs, model, hook) if rebuild
                else "pacing went off, perhaps on this rank first: a rebuild needs every rank at one step")
    if not_safe is None:
        try:
            rebuild_reducer(model, hook.hook)
            hook.reducer = None  # (registered on no live reducer any more)
            obs._lazy = None
            obs._ddp_buckets = None  # (read again from the rebuilt reducer's layout)
            how = "DDP's reducer was rebuilt without it; the per-step cost is the hook-free mode's again"
        except Exception as exc:
            not_safe = f"rebuilding DDP's reducer failed ({type(exc).__name__}: {exc})"
    if not_safe is not None:
        how = (f"it stays registered as a pass-through ({not_safe}): no recording or pacer call per "
               "bucket, but the Python hook's own cost per bucket remains")
    try:
        pg = getattr(model, "process_group", None)
        obs._probe = GradHookProbe(obs, model, "ddp:" + group_name(pg))
        obs.ddp_mode = "grad_hooks"
    except Exception as exc:
        obs.guard.fail("ddp probe", exc)
        obs.ddp_mode = None
    _tell_pacer(obs, False, f"{why}; {how}")
    if obs.rank == 0:
        LOG.info("fabricpace observer: DDP comm hook removed after step %d: %s", obs.step_index, how)


def _tell_pacer(obs: Any, installed: bool, detail: str) -> None:
    pacer = obs.pacer.pacer
    fn = getattr(pacer, "comm_hook_changed", None) if pacer is not None else None
    if fn is None:
        return
    try:
        fn(installed, obs.step_index, detail)
    except Exception as exc:
        obs.pacer.drop(f"comm_hook_changed failed: {exc!r}")


def rebuild_blocker(obs: Any, model: Any, hook: LazyHook) -> str | None:
    """Why DDP's reducer cannot be rebuilt without ``hook`` here (None: it can)."""
    needed = ("_ddp_init_helper", "_build_params_for_reducer", "_build_debug_param_to_name_mapping")
    missing = [m for m in needed if not callable(getattr(model, m, None))]
    if missing or not hasattr(getattr(model, "reducer", None), "_remove_autograd_hooks"):
        return f"this torch's DDP has no {', '.join(missing) or 'Reducer._remove_autograd_hooks'}"
    if hook.reducer is not model.reducer:
        return "DDP's reducer changed since the hook was registered"
    hooks = getattr(model, "_comm_hooks", None)
    if not isinstance(hooks, list) or [h for h, _ in hooks] != [hook.hook]:
        return "another comm hook is registered"
    if getattr(model, "static_graph", False):
        return "static_graph=True"
    if getattr(model, "mixed_precision", None) is not None:
        return "DDP mixed_precision"
    if getattr(model, "_use_python_reducer", False) or getattr(model, "_delay_all_reduce_params", None):
        return "DDP's python reducer or delayed all-reduce"
    if obs.model is not model:
        return "a compiled or wrapped model"
    if any(getattr(p, "device", None) is not None and p.device.type != "cpu" for p in model.parameters()):
        # The rebuild allocates a second set of bucket buffers (the size of the gradients) before it
        # frees the first, and it has only ever run on CPU/gloo: on an accelerator the pass-through's
        # cost per bucket (microseconds against steps of tens to hundreds of ms) is the safer price.
        return "parameters on an accelerator (the rebuild is only tested on CPU/gloo)"
    return None


def rebuild_reducer(model: Any, hook: Callable[[Any, Any], Any]) -> None:
    """Replace ``model``'s reducer by a fresh one without comm hook, as DDP does when unpickled.

    The new reducer is built first (its buckets allocated — an allocation failure leaves everything
    as it was — then its autograd hooks registered); only then are the old reducer's autograd hooks
    removed, so no backward ever runs with neither or both. It starts with DDP's initial bucket layout
    and rebuilds it from the next backward's gradient order, as at a job's start (a broadcast in the
    next forward, on every rank at the same step). Gradients are untouched (tested bitwise)."""
    old_reducer, old_logger = model.reducer, model.logger
    params, sparse = model._build_params_for_reducer()
    mapping = model._build_debug_param_to_name_mapping(params)
    try:
        model._ddp_init_helper(params, sparse, mapping, model.static_graph)
    except BaseException:
        new = model.reducer
        if new is not old_reducer:
            with contextlib.suppress(Exception):
                new._remove_autograd_hooks()
        model.reducer, model.logger = old_reducer, old_logger
        raise
    old_reducer._remove_autograd_hooks()
    model._comm_hooks[:] = [(h, st) for h, st in model._comm_hooks if h is not hook]
    model._has_rebuilt_buckets = False
