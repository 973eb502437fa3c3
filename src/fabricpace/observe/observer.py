"""The Observer: arrival-level telemetry inside a real PyTorch job, at negligible cost.

Lifecycle (every rank runs the same code at the same place):

1. start — rank and world from the initialized process group (or torchrun's environment); one
   small gloo group with its own timeout for the window gathers; rank 0 publishes the run start and
   the run directory on the Store side channel; NTP-style clock alignment; locality probe; rank 0
   writes manifest.json and ranks.parquet; DDP instrumentation (hook-free ``ddp_probe`` or the comm
   hook, see ``ObserverConfig.ddp_instrumentation``) and the gc callback are installed.
2. per step — ``with obs.step(samples=n):`` stamps start and end (one flat-list extend) and does
   one integer compare that schedules all between-step work; the probe (arrivals, end of backward)
   or the comm hook (arrival and completion) stamps each bucket; ``obs.phase`` and
   ``obs.collective`` add optional detail. No collective, no I/O, no numpy happen here.
3. once ``flush_every`` steps and ``flush_interval_s`` have passed — the rows, finalized into
   columns, are handed to the chunk writer thread (one queue put).
4. every ``window`` steps (``window_cycle``) — one fixed-size all-gather of window summaries
   (``windows.py``), started asynchronously and collected ``gather_lag_steps`` (2) steps later at
   the same step on every rank; then the pacer reads them, rank 0 prints the status line and
   updates Prometheus, and every ``clock_every`` steps a background re-alignment starts.
5. close — last chunk, writer drained with a timeout, rank 0 waits (bounded) for every rank to
   report closed, rewrites ranks.parquet with the final clock offsets, writes windows.parquet and
   marks the manifest complete. After an error in the loop nothing waits for a peer (``shutdown``):
   the error propagates unchanged and the manifest stays incomplete, naming it.

Any failure is logged once (``_guard``) and switches off the part that failed; a failure in the
core switches the whole observer off. A DDP comm hook keeps reducing exactly as before; the
hook-free probe's hooks are removed.
"""

from __future__ import annotations

import gc
import os
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from fabricpace._errors import ConfigError
from fabricpace.observe import (
    align,
    chunks,
    collectives,
    ddp_instrument,
    gather_wait,
    locality,
    rank0_files,
    startup,
    window_cycle,
    windows,
)
from fabricpace.observe._guard import LOG, Guard
from fabricpace.observe.clocks import CpuClock, CpuTimeline, EventTimeline, clock_shift_ns
from fabricpace.observe.config import ObserverConfig
from fabricpace.observe.pacer import SafePacer, check_pacing, load_pacer
from fabricpace.observe.recorder import Recorder
from fabricpace.observe.shutdown import abandon_gather, bounded, failure_reason, finish_rank0
from fabricpace.observe.sidechannel import SideChannel, default_store, job_store, session_token
from fabricpace.observe.spans import Span, StepContext
from fabricpace.observe.window_log import WindowLog
from fabricpace.run.manifest import Manifest
from fabricpace.run.window import WindowSummary

_HISTORY_WINDOWS = 64
# ... and at most this many rows in all (64 windows up to 2,048 ranks, 8 at 16,384): a window of
# 16,384 ranks is a 3.3 MB matrix, and 64 of them would hold 210 MB on every rank.
_HISTORY_ROWS = 131_072

RUN_DIR_ENV = "FABRICPACE_RUN_DIR"
_SESSIONS = [0]  # observe() calls in this process: every rank counts the same, so prefixes agree


def _check_comm_hook(model: Any, comm_hook: Any) -> None:
    """torch's own check of a DDP comm hook, on the user's hook, before anything starts: what DDP
    refuses when the hook is registered without the observer (``bf16_compress_hook`` without NCCL,
    wrong annotations) raises the same error from ``observe()``; observed, the job must not run a
    configuration it could not run unobserved."""
    if not isinstance(comm_hook, tuple | list) or len(comm_hook) != 2 or model is None:
        return
    ddp = ddp_instrument.unwrap(model)
    check = getattr(ddp, "_check_comm_hook", None)
    if check is not None and ddp_instrument.model_kind(ddp) == "ddp":
        check(comm_hook[1])


class Observer:
    """Records steps and collectives of this rank into a run directory. Use ``observe()`` to build one."""

    _manifest: Manifest  # rank 0, once its files were first written (rank0_files); absent otherwise

    def __init__(
        self,
        model: Any = None,
        run_dir: str | os.PathLike[str] | None = None,
        *,
        pacing: Any = "off",
        window: int | None = None,
        metrics_port: int | None = None,
        config: ObserverConfig | None = None,
        comm_hook: tuple[Any, Any] | None = None,
        wrap_collectives: bool = False,
        event_source: Any = None,
    ) -> None:
        # Arguments are checked before anything starts: a mistake is a ConfigError here, never a
        # log line after which the job runs without what was asked for.
        if config is not None and not isinstance(config, ObserverConfig):
            raise ConfigError(f"config: got a {type(config).__name__}; "
                              "pass fabricpace.observe.ObserverConfig(field=...)")
        cfg = config or ObserverConfig()
        if window is not None:
            from dataclasses import replace

            cfg = replace(cfg, window=window)  # (ObserverConfig checks it)
        check_pacing(pacing)
        _check_comm_hook(model, comm_hook)
        port_ok = type(metrics_port) is int and 0 < metrics_port < 65536
        if metrics_port is not None and not port_ok:
            raise ConfigError(f"metrics_port={metrics_port!r}: a TCP port 1-65535, or None for no metrics")
        self.config = cfg
        self.model = model
        self.recording = False  # hot-path switch; True once started
        self.closed = False
        self.step_index = -1
        self.summaries: Sequence[WindowSummary] = []  # the last window's summaries (all ranks)
        self._window_log: WindowLog | None = None
        # Rank 0: wall time each window covered (status line rate), and where the last one ended.
        self._window_walls: dict[int, int] = {}
        self._last_window_end: int | None = None
        self.clock_estimate = align.ClockEstimate(0, 0, 0)
        self.clock_updates = 0  # periodic re-alignments completed (the start-up one not counted)
        self.failed_steps: list[int] = []  # steps ended by torch's errors or interrupts (first 100)
        self._data_ns = 0
        self._data_events = False
        self._gc_ns = 0
        self._gc_count = 0
        self._gc_t = 0
        self._samples = 0
        # Between-step work is scheduled by counting ended steps: one integer compare per step.
        self._ended = 0  # steps ended (counted even when recording failed, to keep joining gathers)
        self._next_event = 1  # self._ended value at which _events() runs next
        self._chunk_start = 0  # self._ended at the last flush
        self._next_flush_check = cfg.flush_every
        self._next_window = cfg.window
        self._gather_due = 0  # self._ended value at which the pending gather is collected
        # The first chunk goes out after `flush_every` steps, whatever the interval: it takes the
        # writer's one-off costs (first Parquet part of each table) while training runs, so a rank
        # with little CPU left (a throttled straggler) still drains within close_timeout_s, and a run
        # killed early keeps its first steps.
        self._last_flush = float("-inf")
        self._window_index = 0  # windows whose summaries arrived
        self._windows_closed = 0  # windows whose vectors were sent
        self._pending_gather: tuple[Any, Any, int] | None = None
        self._gather_buf: tuple[Any, list[Any], Any] | None = None  # (world × length, its rows, mine)
        self._group: Any = None
        self._wrapper: Any = None
        self._metrics: Any = None
        self._clock_jobs: queue.Queue[int | None] | None = None
        # Set by the flush timer thread once flush_interval_s passed without a part, with
        # _next_event = 0: the next step end flushes however long steps are (no per-step cost).
        self._flush_due = False
        self._flush_stop: threading.Event | None = None
        # Set while a failed step ends (no gather may start inside it) and for good once the observer
        # is off: _events() then does nothing, whatever the flush timer wrote into _next_event.
        self._hold_events = False
        self._events_off = False
        self._clock_thread: threading.Thread | None = None
        self._ctx = StepContext(self)
        self._rank_row: dict[str, Any] = {}
        # DDP instrumentation: "hook" (Python comm hook) or "grad_hooks" (ddp_probe), None without DDP.
        self.ddp_mode: str | None = None
        self.comm_hook_step: int | None = None  # step after which a lazily requested hook was installed
        self._probe: Any = None
        self._lazy_hook = False
        self._ddp_args: tuple[Any, Any] = (None, None)
        self.rank, self.world, self.distributed = startup.rank_world()
        # The latest windows (all ranks' summaries), for introspection; rank 0's WindowLog keeps them all.
        keep = max(4, min(_HISTORY_WINDOWS, _HISTORY_ROWS // max(self.world, 1)))
        self.window_history: deque[Sequence[WindowSummary]] = deque(maxlen=keep)
        self.guard = Guard(self.rank)
        self.clock = CpuClock(clock_shift_ns(self.rank))
        self.t0 = self.clock.now()
        self.base_ns = self.t0
        self.run_dir = Path(run_dir or os.environ.get(RUN_DIR_ENV) or startup.default_run_dir())
        env_dir = os.environ.get(RUN_DIR_ENV)
        if run_dir and env_dir and Path(env_dir) != self.run_dir and self.rank == 0:
            LOG.warning("fabricpace observer: run_dir=%s from the script wins over %s=%s (fabricpace run "
                        "--run-dir); pass run_dir=None to write where the launcher says", self.run_dir,
                        RUN_DIR_ENV, env_dir)
        self.pacer = SafePacer(None, self.guard, self.rank, self.world)
        _SESSIONS[0] += 1
        self._session = _SESSIONS[0]
        self.channel = SideChannel(None, f"fabricpace/obs{self._session}", cfg.store_timeout_s)
        self._start_rows: dict[int, dict[str, Any]] = {}  # rank rows read at start (close falls back)
        self._left_at: int | None = None  # windows sent when this rank joined under DDP's Join
        self._unwatch_join: Any = None
        try:
            self._start(model, pacing, metrics_port, comm_hook, wrap_collectives, event_source)
        except Exception as exc:  # the job must not notice: switch everything off
            self.guard.fail("observer", exc)
            self._switch_off()
            self._events_off = True
            self._next_event = 1 << 62  # and no window or flush work follows (one compare per step)

    # ------------------------------------------------------------------ start
    def _start(self, model: Any, pacing: Any, metrics_port: int | None, comm_hook: Any,
               wrap_collectives: bool, event_source: Any) -> None:
        cfg = self.config
        # The chunk writer's first part made pyarrow import numpy.ma (pa.array(mask=...)): ~20-40 ms
        # of the GIL and the import lock on the writer thread, at the step that also closes the
        # first window, on every rank (step 50 took 100-180 ms extra in loaded gloo runs). Here it
        # costs start-up time instead.
        import numpy.ma  # noqa: F401

        if self.distributed:
            import torch.distributed as dist

            # Every rank must reach the start before anyone makes the group: a rank that came after
            # its peers gave up would block in gloo's connect to them (~110 s), so it reads "off"
            # from the Store instead, at once (startup.start_gate).
            shared = job_store()
            if shared is not None:
                startup.start_gate(shared, rank=self.rank, world=self.world, session=self._session,
                                   timeout_s=cfg.gather_timeout_s)
            # A private gloo group with its own timeout: window gathers can never hang training
            # (and on NCCL jobs they stay off the GPU).
            self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=cfg.gather_timeout_s))
            # No observer records the collectives on it (its start-up agreement, its window gathers),
            # and this one issues its gathers through the original function whatever is installed.
            collectives.internal_group(self._group)
            self._all_gather = collectives.unwrapped("all_gather")
            # A token agreed through the job's own Store keeps a restarted attempt off the keys an
            # earlier attempt left on the same Store server (sidechannel.session_token).
            token = session_token(job_store(), rank=self.rank, session=self._session,
                                  timeout_s=cfg.store_timeout_s)
            self.channel = SideChannel(default_store(cfg.store_timeout_s),
                                       f"fabricpace/{token}/obs{self._session}", cfg.store_timeout_s)
            if self.channel.store is None:
                raise RuntimeError("no Store on the default process group")
        if not self.distributed:
            self.run_dir = startup.fresh_dir(self.run_dir, self.rank)
        elif self.rank == 0:
            self.channel.set_json("start", {"t0": self.t0, "run_dir": str(self.run_dir)})
        else:
            info = self.channel.get_json("start")
            self.run_dir = Path(info["run_dir"])  # rank 0's (its default name has its start time)
            self.t0 = int(info["t0"])  # rank 0's clock; aligned time = local - offset - t0
        if self.distributed:
            # window and gather_lag_steps must be the same everywhere (a rank gathering at another
            # step held every rank for gather_timeout_s): agreed on the same all-reduce.
            self.run_dir, agreed = startup.agreed_dir(self.run_dir, self.rank, self._group,
                                                      (cfg.window, cfg.gather_lag_steps))
            if agreed is not None:
                self._use_rank0_settings(*agreed)
                cfg = self.config
        self.base_ns = self.t0
        if self.distributed:
            self._clock_sync = align.ClockSync(self.channel, rank=self.rank, world=self.world,
                                               now=self.clock.now, rounds=cfg.clock_rounds,
                                               domain=align.clock_domain(self.clock.shift_ns))
            self.clock_estimate = self._clock_sync.exchange(0)
            self.base_ns = self.t0 + self.clock_estimate.offset_ns
        timeline: Any = CpuTimeline(self.clock)
        if event_source is not None or startup.on_cuda(model):
            from fabricpace.observe.clocks import CudaEventSource

            timeline = EventTimeline(self.clock, event_source or CudaEventSource(startup.cuda_device(model)))
        self.recorder = Recorder(timeline)
        self._data_events = self.recorder.deferred  # data phases in device time (see spans.Span)
        self.sink = chunks.ChunkSink(self.run_dir, self.rank, self.guard, threaded=cfg.flush_mode == "thread",
                                     compact=cfg.compact_parts)
        if self.rank == 0:
            self._window_log = WindowLog(self.sink)
        self._publish_rank()
        self._save_topology()
        if self.rank == 0:
            rank0_files.write_rank0_files(self, complete=False, model=model, pacing=pacing)
        try:
            self.pacer = SafePacer(
                load_pacer(pacing, rank=self.rank, world=self.world, run_dir=self.run_dir, window=cfg.window),
                self.guard, self.rank, self.world,
            )
        except Exception as exc:
            self.guard.fail("pacing", exc)
        gc.callbacks.append(self._on_gc)
        if model is not None:
            model = ddp_instrument.unwrap(model)
            kind = ddp_instrument.model_kind(model)
            if kind == "ddp":
                ddp_instrument.instrument_ddp(self, model, comm_hook, pacing)
                if self.distributed:
                    self._unwatch_join = ddp_instrument.watch_join(self, model)
            else:
                wrap_collectives = ddp_instrument.explain_model(self, model, kind, wrap_collectives,
                                                                comm_hook)
        if wrap_collectives:
            self._wrapper = collectives.CollectiveWrapper(self)
            self._wrapper.install()
        if metrics_port is not None and self.rank == 0:
            try:
                from fabricpace.observe.status import Metrics

                self._metrics = Metrics(metrics_port)
            except Exception as exc:
                self.guard.fail("metrics", exc)
        if self.distributed and cfg.clock_every > 0:
            self._clock_jobs = queue.Queue()
            self._clock_thread = threading.Thread(
                target=self._clock_loop, name="fabricpace-clock", daemon=True
            )
            self._clock_thread.start()
        if cfg.flush_interval_s > 0:
            self._flush_stop = threading.Event()
            threading.Thread(target=self._flush_timer, args=(cfg.flush_interval_s, self._flush_stop),
                             name="fabricpace-flush-timer", daemon=True).start()
        self.recording = True

    def _use_rank0_settings(self, window: int, lag: int) -> None:
        """The ranks passed different ``window=``/``gather_lag_steps``: every rank takes rank 0's
        (rank 0 says so once), so the window gathers still meet at the same step."""
        from dataclasses import replace

        cfg = self.config
        if self.rank == 0:
            LOG.warning("fabricpace observer: ranks passed different window= or gather_lag_steps= "
                        "values; every rank uses rank 0's (window=%d, gather_lag_steps=%d)", window, lag)
        elif (cfg.window, cfg.gather_lag_steps) != (window, lag):
            LOG.info("fabricpace observer (rank %d): window=%d, gather_lag_steps=%d replaced by rank 0's "
                     "(%d, %d)", self.rank, cfg.window, cfg.gather_lag_steps, window, lag)
        self.config = replace(cfg, window=window, gather_lag_steps=lag)
        self._next_window = window

    def _joined(self, why: str = "joined (DDP Join)") -> None:
        """This rank's inputs ran out under DDP's ``Join`` (or ``why``): it starts no more window
        gathers, so tell the peers (``gather_wait``) which gather it will not join. Once; the Store
        call runs on a helper thread (Join's shadowing loop must not wait on the Store)."""
        if self._left_at is not None or self.closed or not self.distributed:
            return
        self._left_at = sent = self._windows_closed
        channel = self.channel
        LOG.info("fabricpace observer (rank %d): %s after %d windows; window summaries end there for "
                 "every rank", self.rank, why, sent)

        def tell() -> None:
            try:
                gather_wait.mark_left(channel, sent)
            except Exception as exc:
                self.guard.fail("join", exc)

        threading.Thread(target=tell, name="fabricpace-join", daemon=True).start()

    def _remove_probe(self) -> None:
        probe, self._probe = self._probe, None
        if probe is not None:
            probe.remove()

    def _publish_rank(self) -> None:
        row = locality.probe(self.rank, startup.cuda_device(self.model))
        row["clock_offset_ns"] = self.clock_estimate.offset_ns
        row["clock_err_ns"] = self.clock_estimate.err_ns
        self._rank_row = row
        self._leaf = windows.leaf_id(row.get("leaf_name"))
        self.channel.set_json(f"rank/{self.rank}", row)

    def _save_topology(self) -> None:
        """One rank per host saves `nvidia-smi topo -m` (when the tool exists) under locality/."""
        if self._rank_row.get("local_rank") not in (0, None):
            return
        try:
            text = locality.nvidia_topo(self.config.probe_timeout_s)
            if text:
                path = self.run_dir / "locality" / f"{self._rank_row['host']}-nvidia-topo.txt"
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                tmp.write_text(text)
                os.replace(tmp, path)
        except Exception as exc:
            self.guard.fail("locality", exc)

    # ------------------------------------------------------------------ hot path
    def step(self, samples: int = 0) -> StepContext:
        """Context manager around one training step; ``samples`` = this rank's samples in it."""
        self._samples = samples
        return self._ctx

    def phase(self, name: str) -> Span:
        """Time a phase of the step (``"data"`` counts as data time)."""
        return Span(self, "phase", name, 0)

    def collective(self, name: str, nbytes: int = 0, group: str = "world") -> Span:
        """Record a blocking collective issued by hand (arrival on enter, completion on exit)."""
        return Span(self, group, name, nbytes)

    def batch_share(self, global_batch: int) -> int:
        """This rank's samples of ``global_batch`` for the next step (equal split when pacing is off)."""
        return self.pacer.batch_share(global_batch)

    def _on_gc(self, phase: str, _info: dict[str, Any]) -> None:
        # Host time on both paths, never a device stamp: a collection can start on any thread, also
        # inside the user's CUDA-graph capture, where an event record could invalidate the capture.
        if phase == "start":
            self._gc_t = self.clock.now()
        elif self._gc_t:
            self._gc_ns += self.clock.now() - self._gc_t
            self._gc_count += 1
            self._gc_t = 0

    def _begin_step(self) -> None:
        self.step_index += 1
        if not self.recording:
            return
        try:
            pacer = self.pacer
            if pacer.pacer is not None:
                pacer.on_step_start(self.step_index)
            self._data_ns = 0
            self._gc0 = self._gc_ns
            self._gcc0 = self._gc_count
            self.recorder.begin(self.step_index)
        except Exception as exc:
            self._fail_recording(exc)

    def _end_step(self) -> None:
        # The hot path: a few attribute reads, one flat-list extend (recorder.end), one integer compare.
        if self.closed:
            return
        if self.recording:
            try:
                pacer = self.pacer
                paced = pacer.on_step_end(self.step_index) if pacer.pacer is not None else 0
                probe = self._probe
                if probe is not None and (probe.main_work or probe.armed[0]):
                    self._probe_step()
                self.recorder.end(self._data_ns, self._gc_ns - self._gc0, self._gc_count - self._gcc0,
                                  paced, self._samples)
            except Exception as exc:
                self._fail_recording(exc)
        self._ended += 1
        if self._ended >= self._next_event:
            self._events()

    def _events(self) -> None:
        """Between-step work that is due: flush a chunk, collect a gather, close a window."""
        if self._events_off:
            self._next_event = 1 << 62
            return
        if self._hold_events:
            return
        n = self._ended
        cfg = self.config
        if n >= self._next_flush_check or self._flush_due:
            self._flush_due = False
            if self.recording and (n - self._chunk_start >= cfg.flush_max_steps
                                   or time.monotonic() - self._last_flush >= cfg.flush_interval_s):
                try:
                    self._flush()
                except Exception as exc:
                    self._fail_recording(exc)
                self._next_flush_check = n + cfg.flush_every
            else:  # not yet flush_interval_s: look again flush_every steps later (never beyond max)
                self._next_flush_check = min(n + cfg.flush_every, self._chunk_start + cfg.flush_max_steps)
        # Window boundaries are counted even when recording failed, so this rank keeps joining the
        # gathers its peers expect (with an empty contribution) instead of making them time out.
        if self._pending_gather is not None and n >= self._gather_due:
            self._finish_gather()
        if n >= self._next_window:
            self._next_window = n + cfg.window
            self._window()
        nxt = min(self._next_flush_check, self._next_window)
        if self._pending_gather is not None:
            nxt = min(nxt, self._gather_due)
        self._next_event = max(nxt, n + 1)
        if self._flush_due:  # read after the store: a timer request between the two is not lost
            self._next_event = n + 1

    def _flush_timer(self, interval: float, stop: threading.Event) -> None:
        """Ask for a flush at the next step end once ``interval`` passed since the last part: the
        step-count check alone wrote nothing for ``flush_every`` steps, which with 10 s steps was
        500 s of rows lost to a SIGKILL. Wakes about once per interval; never touches the rows."""
        start = time.monotonic()
        while True:
            last = self._last_flush
            pause = (start if last == float("-inf") else last) + interval - time.monotonic()
            if pause > 0:
                if stop.wait(min(pause, 3600.0)):
                    return
                continue
            self._flush_due = True
            self._next_event = 0
            if stop.wait(min(interval, 3600.0)):
                return

    def _end_failed_step(self, exc_type: Any = None) -> None:
        """The user's step raised. No window gather starts now — the peers may never reach it (they
        wait in the user's collective for this rank), and close() would then block in it for
        gather_timeout_s; the next step that ends normally runs it.

        Whether the step is written depends on what ended it. The user's own exceptions (ValueError,
        a failed log call, ...) are often raised after the step did all its work, so it is written as
        before. torch's errors (RuntimeError and its subclasses: a collective that failed because a
        peer died, out of memory) and interrupts end a step that did not complete: its time is not a
        step's (blocked until the transport gave up, seconds the split calls compute as no backward
        ended), and such a row skewed every step statistic of the run. It is counted instead
        (``failed_steps``; rank 0's go to the manifest) and its collectives leave no rows."""
        if isinstance(exc_type, type) and (issubclass(exc_type, RuntimeError)
                                           or not issubclass(exc_type, Exception)):
            self._drop_failed_step()
            return
        self._hold_events = True
        try:
            self._end_step()
        finally:
            self._hold_events = False

    def _drop_failed_step(self) -> None:
        if self.closed:
            return
        if len(self.failed_steps) < 100:
            self.failed_steps.append(self.step_index)
        if self.recording:
            try:
                pacer = self.pacer
                if pacer.pacer is not None:
                    pacer.on_step_end(self.step_index)  # (its step count stays the same on every rank)
                probe = self._probe
                if probe is not None and (probe.main_work or probe.armed[0]):
                    self._probe_step()
                self.recorder.discard()
            except Exception as exc:
                self._fail_recording(exc)
        self._ended += 1  # (the postponed events run at the next step that ends normally)

    def _probe_step(self) -> None:
        probe = self._probe
        try:
            probe.end_step(self.recorder)
            if probe.failed:  # a hook or callback failed (already logged): its hooks are gone
                self._probe = None
        except Exception as exc:  # bucket records stop; steps go on being recorded
            self.guard.fail("ddp probe", exc)
            self._remove_probe()
            # The layout could not be learned (the same on every rank): in "auto", observe through
            # the comm hook instead, from the next step on.
            if probe.learning and self.config.ddp_instrumentation == "auto":
                self._lazy_hook = False
                ddp_instrument.install_hook(self, *self._ddp_args)

    def _fail_recording(self, exc: BaseException) -> None:
        self.guard.fail("recording", exc)
        self.recording = False
        try:
            self._remove_probe()
        except Exception as exc2:
            self.guard.fail("ddp probe", exc2)

    # ------------------------------------------------------------------ chunks and windows
    def _flush(self) -> None:
        self._chunk_start = self._ended
        self._last_flush = time.monotonic()
        s, c, o = self.recorder.take_chunk()
        self.sink.submit({"steps": s, "collectives": c, "ops": o}, self.base_ns)

    def _window(self) -> None:
        window_cycle.close_window(self)

    def _finish_gather(self) -> None:
        window_cycle.finish_gather(self)

    # ------------------------------------------------------------------ clock re-alignment
    def _clock_loop(self) -> None:
        assert self._clock_jobs is not None
        while True:
            epoch = self._clock_jobs.get()
            if epoch is None:
                return
            if not self.guard.ok("clock"):
                continue
            try:
                est = self._clock_sync.exchange(epoch)
            except Exception as exc:
                self.guard.fail("clock", exc)
                continue
            self.clock_updates += 1
            if self.rank != 0:
                self.clock_estimate = est
                self.base_ns = self.t0 + est.offset_ns  # one int assignment: atomic for readers
            self._rank_row.update(clock_offset_ns=est.offset_ns, clock_err_ns=est.err_ns)
            try:
                self.channel.set_json(f"rank/{self.rank}", self._rank_row)
            except Exception as exc:
                self.guard.fail("clock", exc)

    # ------------------------------------------------------------------ close
    def close(self, error: BaseException | None = None) -> None:
        """Flush, drain the writer (bounded), and let rank 0 mark the run complete. Idempotent.

        ``error``: the exception that ends the training loop (``with`` passes it; a bare ``close()``
        inside an ``except`` block finds it itself). After an error nothing waits for the peers — they
        are typically blocked in the user's collective for this rank, or gone — so close takes only
        local time plus one bounded Store call, the exception propagates unchanged, and the manifest
        stays incomplete with the error named.
        """
        if self.closed:
            return
        reason = failure_reason(error if error is not None else sys.exc_info()[1])
        was_recording = self.recording
        self.recording = False
        self.closed = True
        try:
            if self._pending_gather is not None:
                if reason is None:
                    self._finish_gather()  # every rank closes after the same steps: collect the last window
                else:
                    abandon_gather(self)
            if was_recording:
                poll = getattr(self.recorder.timeline, "source", None)
                if poll is not None and self.recorder._pending:
                    poll.synchronize()  # close is off the hot path: resolve the last device events
                    self.recorder.poll(final=True)  # an exit stamp missing now will never come
                self._flush()
            drained = self.sink.close(self.config.close_timeout_s) if hasattr(self, "sink") else True
            if not drained:
                self.guard.fail("writing", "writer did not drain within close_timeout_s")
            sink = getattr(self, "sink", None)
            if sink is not None and not sink.enabled and not any(sink.parts.values()):
                # A read-only or full disk from the start: one line per rank said so at start, and the
                # run exited 0 with obs.run_dir naming a directory that holds nothing of this rank.
                LOG.warning("fabricpace observer (rank %d): nothing was written to %s: writing was off "
                            "before the first part (%s)", self.rank, self.run_dir,
                            self.guard.failed.get("writing", "unknown reason"))
        except Exception as exc:
            self.guard.fail("close", exc)
        self._switch_off()
        if not hasattr(self, "sink"):
            return
        # The Store call runs in a helper thread, bounded by close_timeout_s: a frozen Store (its
        # host stopped, not dead) must not hold the user's process at exit.
        channel, key, sent = self.channel, f"closed/{self.rank}", self._windows_closed

        marked = self._left_at is not None  # said so already when it joined under DDP's Join

        def tell() -> None:
            if self.distributed and not marked:  # peers waiting in a gather it will never join stop
                gather_wait.mark_left(channel, sent)
            channel.set(key, "error" if reason else "1")

        told = bounded(tell, self.config.close_timeout_s, self.guard, channel)
        if self.rank == 0:
            try:
                finish_rank0(self, reason, wait=told and reason is None)
            except Exception as exc:
                self.guard.fail("close", exc)

    def _switch_off(self) -> None:
        self.recording = False
        for action in (self._remove_probe, self._remove_gc, self._stop_threads, self.pacer.close,
                       self._stop_join_watch):
            try:
                action()
            except Exception as exc:
                self.guard.fail("close", exc)

    def _stop_join_watch(self) -> None:
        undo, self._unwatch_join = self._unwatch_join, None
        if undo is not None:
            undo()

    def _remove_gc(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._wrapper is not None:
            self._wrapper.uninstall()
            self._wrapper = None
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None

    def _stop_threads(self) -> None:
        if self._flush_stop is not None:
            self._flush_stop.set()
            self._flush_stop = None
        if self._clock_jobs is not None and self._clock_thread is not None:
            self._clock_jobs.put(None)
            self._clock_thread.join(self.config.close_timeout_s)
            self._clock_jobs = None

    def __enter__(self) -> Observer:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.close(exc)

    @property
    def failures(self) -> dict[str, str]:
        """Parts of the observer that failed (part -> first reason)."""
        return dict(self.guard.failed)
