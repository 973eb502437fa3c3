"""Hook-free DDP instrumentation: bucket arrivals from post-accumulate-grad hooks, no comm hook.

Any Python DDP comm hook costs every bucket a GIL round trip on the communication thread plus an
extra scaling pass (measured at +2..+8% of a step on this 2-core gloo machine, see
docs/observer.md). ``GradHookProbe`` leaves DDP's built-in C++ reduction alone — gradients are
untouched, so trivially bitwise identical — and records each bucket's *arrival* from
``Tensor.register_post_accumulate_grad_hook`` on the autograd thread:

1. **Learning** (usually steps 0–1): every parameter DDP reduces is hooked and its ready order
   stamped. DDP rebuilds its buckets from the first iteration's ready order; once the reducer
   reports the rebuilt layout (``_get_ddp_logging_data()['rebuilt_per_bucket_param_indices']``,
   identical on every rank because rank 0's layout is broadcast), the membership is known. If DDP
   will never rebuild (``find_unused_parameters`` without ``static_graph``), the initial layout is
   recomputed the way DDP's constructor computes it.
2. **Steady state**: every hook is removed except the one on the last-ready parameter of each
   bucket, so a step costs one Python call per bucket (a clock read and a list store) plus two
   queued engine callbacks.

Arrival (t_enter) = the moment the bucket's last gradient was accumulated, just before DDP's own
hook for that parameter copies it into the bucket and launches the all-reduce (one gradient copy
earlier than the comm-hook mode's stamp). Completion is seen per backward, not per bucket: the
first bucket hook of a backward queues an engine callback, which queues a second one; the second
runs after DDP's queued ``finalize_backward`` (which waits for every bucket's all-reduce and writes
the averaged gradients) and stamps the end of the backward. The last bucket's row ends there; the
other buckets' rows are arrival markers (t_exit = t_enter, see ``Recorder.buckets``). What this
mode cannot see: when each bucket's transfer finished, i.e. communication hidden under compute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fabricpace.observe._guard import LOG

MODES = ("auto", "hook", "grad_hooks")
_MAX_ROUNDS = 64  # synchronized backwards kept between two step ends (bounded if steps are not used)


def choose_mode(setting: str, *, user_hook: bool, pacing: Any, pacer: Any) -> tuple[str, bool]:
    """(mode, lazy) for ``ObserverConfig.ddp_instrumentation`` = ``setting``.

    mode is "hook" (Python comm hook, per-bucket completion, pacer bucket calls) or "grad_hooks";
    lazy = start hook-free and install the comm hook once the pacer's ``wants_comm_hook()`` says so.
    "auto" uses the comm hook only when something needs it now: a user hook to wrap, pacing that
    names "comm" explicitly, or a pacer object that takes bucket calls but cannot say when it wants
    them (no ``wants_comm_hook``).
    """
    if setting in ("hook", "grad_hooks"):
        return setting, False
    if user_hook:
        return "hook", False
    if pacer is None:
        return "grad_hooks", False
    if isinstance(pacing, str):
        items = [p.strip().lower() for p in pacing.split(",")]
        if "comm" in items:
            return "hook", False
    elif isinstance(pacing, (list, tuple)) and "comm" in [str(p).strip().lower() for p in pacing]:
        return "hook", False
    if callable(getattr(pacer, "wants_comm_hook", None)):
        return "grad_hooks", True
    if isinstance(pacing, str) and pacing.strip().lower() != "auto":
        return "grad_hooks", False  # e.g. "gc" or "gc,rebalance": no bucket calls needed
    return "hook", False


def reducer_params(model: Any) -> list[Any]:
    """The parameters in the order DDP's reducer indexes them (DDP._build_params_for_reducer, without
    its side effect): per module, its own parameters that require grad and are not ignored, deduped."""
    ignore = set(getattr(model, "parameters_to_ignore", ()) or ())
    seen: set[int] = set()
    out = []
    for mname, module in model.module.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if p.requires_grad and f"{mname}.{pname}" not in ignore and id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def parse_bucket_indices(text: str) -> list[list[int]]:
    """'5 4 3 2, 1 0' (DDP logging data) -> [[5, 4, 3, 2], [1, 0]]."""
    return [[int(v) for v in part.split()] for part in str(text).split(",") if part.strip()]


def initial_buckets(model: Any, params: list[Any]) -> list[list[int]] | None:
    """The bucket layout DDP's constructor assigns (used when it will never rebuild); None if the
    private helpers it uses are not there in this torch version."""
    try:
        import torch
        import torch.distributed as dist

        limits, _ = model._bucket_config.compute_bucket_size_limits(
            static_graph=bool(getattr(model, "static_graph", False)),
            find_unused_parameters=bool(model.find_unused_parameters),
        )
        owner = {id(p): m for m in model.module.modules() for p in m.parameters(recurse=False)}
        sparse = [isinstance(owner.get(id(p)), (torch.nn.Embedding, torch.nn.EmbeddingBag))
                  and bool(owner[id(p)].sparse) for p in params]
        indices, _ = dist._compute_bucket_assignment_by_size(params, limits, sparse)
        return [list(b) for b in reversed(indices)]
    except Exception as exc:
        LOG.debug("fabricpace observer: initial DDP bucket layout unavailable: %r", exc)
        return None


class GradHookProbe:
    """Records DDP bucket arrivals without a comm hook (see the module docstring).

    Autograd-thread methods: the hooks and the two queued callbacks. Main-thread methods:
    ``end_step`` (between steps, when no backward runs) and ``remove``.
    """

    def __init__(self, observer: Any, model: Any, group_name: str, *, learn_max_steps: int = 20) -> None:
        import torch

        if getattr(model, "reducer", None) is None or not hasattr(model, "module"):
            raise TypeError(f"{type(model).__name__} is not a DistributedDataParallel module")
        self.obs = observer
        self.model = model
        self.group = group_name
        self.mark: Callable[[], Any] = observer.recorder.mark
        self.params = reducer_params(model)
        self.learn_max_steps = learn_max_steps
        self.learning = True
        self.learn_steps = 0
        self.buckets: list[list[int]] | None = None
        self.bucket_bytes: list[int] = []
        self.kept: list[int] = []  # parameter index hooked per bucket (steady state)
        self.failed = False
        self._queue = torch.autograd.Variable._execution_engine.queue_callback
        self._handles: list[Any] = []
        self._rounds: list[tuple[list[Any], list[int], Any]] = []
        self.armed = [False]  # a backward's callbacks are queued (a cell: the hooks bind it)
        self._armed_cell = self.armed
        # Steady state on a host clock: whole backwards go straight into the recorder's flat round
        # buffer from the final callback, so the training thread has nothing to do at step end.
        # Learning, the CUDA path (events resolved later) and failures need ``end_step`` every step.
        self._flat = not observer.recorder.deferred
        self.main_work = True
        self._round_buf: list[Any] | None = None
        self._order = 0
        n = len(self.params)
        self._nones: list[Any] = [None] * n
        self._stamps: list[Any] = [None] * n
        self._seen: list[int] = [-1] * n
        self._after: Callable[[], None] = self._after_backward
        for i, p in enumerate(self.params):
            self._handles.append(p.register_post_accumulate_grad_hook(self._learn_hook(i)))

    # ---- autograd thread -------------------------------------------------------------------
    def _learn_hook(self, i: int) -> Callable[[Any], None]:
        def hook(_param: Any) -> None:
            try:
                self._stamps[i] = self.mark()
                self._seen[i] = self._order
                self._order += 1
                if not self._armed_cell[0]:
                    self._armed_cell[0] = True
                    self._queue(self._after_backward)
            except Exception as exc:  # never raise into the user's backward
                self._fail(exc)

        return hook

    def _bucket_hook(self, k: int, stamps: list[Any]) -> Callable[[Any], None]:
        # The hot path: one call per bucket per backward. Everything it touches is bound here.
        mark, queue, after, armed = self.mark, self._queue, self._after, self._armed_cell

        def hook(_param: Any) -> None:
            try:
                stamps[k] = mark()
                if not armed[0]:
                    armed[0] = True
                    queue(after)
            except Exception as exc:
                self._fail(exc)

        return hook

    def _after_backward(self) -> None:
        # Runs in the engine's post-processing, possibly before DDP's finalize_backward (queued
        # later, when the last bucket was marked ready): queue once more to run after it.
        try:
            self._queue(self._done)
        except Exception as exc:
            self._armed_cell[0] = False
            self._fail(exc)

    def _done(self) -> None:
        try:
            t_exit = self.mark()
            stamps = self._stamps
            snapshot = stamps[:]
            stamps[:] = self._nones  # in place: the bucket hooks hold this very list
            seen = self._seen
            if self.learning:
                self._seen = [-1] * len(seen)
                self._order = 0
            self._armed_cell[0] = False
            # Backwards inside ``ddp.no_sync()`` reduce nothing: no collective to record.
            if (self.obs.recording and self.model.require_backward_grad_sync
                    and len(self._rounds) < _MAX_ROUNDS):
                self._rounds.append((snapshot, seen, t_exit))
        except Exception as exc:
            self._armed_cell[0] = False
            self._fail(exc)

    def _done_flat(self) -> Callable[[], None]:
        # The steady-state final callback on a host clock: one clock read, one extend, one append.
        mark, armed, model, obs = self.mark, self._armed_cell, self.model, self.obs
        stamps, nones = self._stamps, self._nones
        buf = self._round_buf
        assert buf is not None
        ext, app = buf.extend, buf.append
        # The round buffer is drained at every window close and flush, i.e. at least every `window`
        # steps: allow _MAX_ROUNDS backwards per step of that span. Only a job that never calls
        # obs.step() (nothing drains) ever reaches the bound, which then caps its memory.
        window = int(getattr(getattr(obs, "config", None), "window", 50))
        cap = _MAX_ROUNDS * max(window, 1) * (len(stamps) + 1)

        def done() -> None:
            try:
                t_exit = mark()
                # Backwards inside ``ddp.no_sync()`` reduce nothing: no collective to record.
                if obs.recording and model.require_backward_grad_sync and len(buf) < cap:
                    ext(stamps)
                    app(t_exit)
                stamps[:] = nones  # in place: the bucket hooks hold this very list
                armed[0] = False
            except Exception as exc:
                armed[0] = False
                self._fail(exc)

        return done

    def _fail(self, exc: BaseException) -> None:
        self.failed = True
        self.main_work = True
        self.obs.guard.fail("ddp probe", exc)

    # ---- main thread -----------------------------------------------------------------------
    def end_step(self, recorder: Any) -> None:
        """Turn this step's backwards into bucket records (main thread, between steps)."""
        if self.failed:
            self.remove()
            return
        rounds, self._rounds = self._rounds, []
        if self._armed_cell[0]:
            # A backward that raised never ran its final callbacks: re-arm for the next one.
            self._armed_cell[0] = False
            self._stamps[:] = self._nones
            self._seen = [-1] * len(self._seen)
            self._order = 0
        if not self.learning:
            for stamps, _seen, t_exit in rounds:
                recorder.buckets(self.group, self.bucket_bytes, stamps, t_exit)
            return
        self.learn_steps += 1
        if self.buckets is None:
            self.buckets = self._layout()
        if self.buckets is None:
            if self.learn_steps >= self.learn_max_steps:
                raise RuntimeError(f"DDP's bucket layout was not known after {self.learn_steps} steps")
            return
        # Records for this step from the all-parameter stamps: a bucket arrives with its last gradient.
        last_round: list[int] | None = None
        for stamps, seen, t_exit in rounds:
            enters = []
            for members in self.buckets:
                ready = [i for i in members if seen[i] >= 0]
                full = len(ready) == len(members)
                enters.append(stamps[max(ready, key=lambda i: seen[i])] if full else None)
            recorder.buckets(self.group, self.bucket_bytes, enters, t_exit)
            last_round = seen
        if last_round is not None:
            self._keep_last_ready(last_round)

    def _layout(self) -> list[list[int]] | None:
        """Bucket membership (reducer parameter indices per bucket), once DDP has fixed it."""
        model = self.model
        rebuilds = not (model.find_unused_parameters and not getattr(model, "static_graph", False))
        if rebuilds:
            data = model._get_ddp_logging_data()
            if not int(data.get("has_rebuilt_buckets", 0) or 0):
                return None
            buckets: list[list[int]] | None = parse_bucket_indices(
                data.get("rebuilt_per_bucket_param_indices", ""))
        else:
            buckets = initial_buckets(model, self.params)
        if not buckets or sorted(i for b in buckets for i in b) != list(range(len(self.params))):
            raise RuntimeError("DDP's bucket layout does not match its parameters")
        self.bucket_bytes = [sum(self.params[i].numel() * self.params[i].element_size() for i in b)
                             for b in buckets]
        return buckets

    def _keep_last_ready(self, seen: list[int]) -> None:
        """Replace the learning hooks by one hook per bucket, on its last-ready parameter."""
        assert self.buckets is not None
        self.kept = [max(b, key=lambda i: seen[i]) for b in self.buckets]
        self.remove()
        self.learning = False
        self._nones = [None] * len(self.buckets)
        self._stamps = [None] * len(self.buckets)
        self._seen = []
        if self._flat:
            self._round_buf = self.obs.recorder.round_buffer(self.group, self.bucket_bytes)
            done = self._done_flat()

            def after() -> None:
                try:
                    self._queue(done)
                except Exception as exc:
                    self._armed_cell[0] = False
                    self._fail(exc)

            self._after = after
        self._handles = [self.params[i].register_post_accumulate_grad_hook(self._bucket_hook(k, self._stamps))
                         for k, i in enumerate(self.kept)]
        self.main_work = not self._flat

    def remove(self) -> None:
        """Remove every hook this probe registered (idempotent); training is unaffected."""
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()
        self._rounds = []
