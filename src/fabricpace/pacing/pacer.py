"""The real-rank pacer: the observer's hooks (CONTRACTS.md) driving the controller and the actuators.

The observer calls ``on_step_start/on_step_end`` every step, ``before_bucket/after_bucket`` from its
DDP comm hook, ``on_window`` after each window gather, ``batch_share`` for the user's loop, ``status``
for the live line and ``close`` at the end. The controller runs inside ``on_window``; any exception
or an update slower than ``controller_timeout_s`` turns pacing off on this rank (gc restored, equal
shares, no gating) with the reason logged, and training goes on.

Rank 0 writes every decision to ``RUN_DIR/pacing.parquet``: appended as parts by a writer thread and
joined into the one table at close (``decision_log``).

The comm actuator acts through the observer's DDP comm hook, which costs time on every bucket. The
observer installs it when ``wants_comm_hook()`` turns True (a comm trial starts, or comm is kept) and,
for this pacer (``comm_hook_removable``), removes it again once it turns False (a reverted trial):
``comm_hook_changed`` tells the pacer, which then learns the comm trigger's quiet level anew (the
hook-free mode measures only exposed transfer) and records the switch in pacing.parquet. Comm is not
tried when DDP has no more buckets than the in-flight window it would set (``set_comm_buckets``), nor,
under ``"auto"``, when every rank runs on one host (``hosts_from_env``): comm paces a shared fabric,
and on one host there is none; what inflates transfer there is CPU scheduling.
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fabricpace.pacing._bounded import BoundedRunner, TimedOut
from fabricpace.pacing.actuators import CommGate, GcLockstep
from fabricpace.pacing.config import PacingConfig, parse_policies
from fabricpace.pacing.controller import Controller
from fabricpace.pacing.decision_log import DecisionLog, decisions_table
from fabricpace.pacing.rebalance import counts_from_shares, offsets_from_counts
from fabricpace.pacing.state import Decision, PacingState
from fabricpace.run.window import WINDOW_FIELDS, WindowSummary, summary_matrix

log = logging.getLogger("fabricpace.pacing")


class Pacer:
    """Implements the pacer hook protocol for one rank."""

    def __init__(
        self,
        policies: Sequence[str] | str,
        *,
        rank: int,
        world_size: int,
        run_dir: str | Path | None,
        window: int,
        config: PacingConfig | None = None,
        leaves: Sequence[int] | None = None,
        share_lag_steps: int = 4,
        hosts: int | None = None,
    ) -> None:
        self.config = config or PacingConfig()
        self.policies = parse_policies(policies if isinstance(policies, str) else list(policies))
        self.rank, self.world_size, self.window = rank, world_size, window
        self.run_dir = Path(run_dir) if run_dir is not None else None
        # What was changed about the policies and why (the observer puts it in the manifest).
        self.notes: list[str] = []
        implied = isinstance(policies, str) and policies.strip().lower() == "auto"
        if implied and hosts == 1 and world_size > 1 and "comm" in self.policies:
            # comm paces a shared fabric; inside one host transfer "inflates" when the ranks' threads
            # wait for a CPU (the audit's single-host job: "transfer 5.29x its quiet level"), which no
            # launch gating helps. An explicit "comm" is the user's choice and stays.
            self.policies = tuple(p for p in self.policies if p != "comm")
            self.notes.append(f"comm left out: all {world_size} ranks run on one host (no fabric to pace; "
                              "transfer there varies with CPU scheduling); name 'comm' to try it anyway")
            if rank == 0:
                log.info("pacing: %s", self.notes[-1])
        self.controller = Controller(world_size, self.config, self.policies, leaves=leaves)
        self.state = PacingState()
        self.gc = GcLockstep()
        self.comm = CommGate()
        self.enabled = True
        self.off_reason: str | None = None
        self.decisions: list[Decision] = []
        # Shares change `share_lag_steps` after the window that decided them, identically on every
        # rank, so a sampler that prefetches up to that many batches never mixes old and new shares.
        self.share_lag_steps = int(share_lag_steps)
        self._share_steps: list[int] = [0]
        self._share_values: list[tuple[float, ...] | None] = [None]
        self._next_step = 0
        self._last_step_time_ns = 0.0
        self.controller_s = 0.0
        # The length the observer gives the next window, decided at the last ``on_window``: None = the
        # usual ``window`` steps; else close it once the observer has ended step ``next_window_end``-1
        # (a rebalance trial's short first ON window, counted from the step its shares apply).
        # ``window_plan_known`` is False when this rank's controller did not return within its time
        # limit: its peers may close the open window early, and this rank cannot tell.
        self.next_window_end: int | None = None
        self.window_plan_known = True
        self._hook_seen = False  # a comm hook has called before_bucket
        self._hook_new = False  # ...for the first time since the last window (or it was removed)
        self._hook_installed = False  # the observer installed its comm hook (comm_hook_changed)
        self._runner = BoundedRunner(f"fabricpace-controller-{rank}")
        self._log: DecisionLog | None = None
        self._written = 0  # decisions handed to the log so far
        if self.rank == 0 and self.run_dir is not None:
            import fabricpace.run.writer  # noqa: F401  (import pyarrow now, not at the first decision)

            self._log = DecisionLog(self.run_dir, rank)

    # The observer may remove its comm hook again when wants_comm_hook() turns False (a reverted
    # trial): it asks after every window, not only until the first True (docs/observer.md).
    comm_hook_removable = True

    # ----------------------------------------------------------------------------------- hooks
    def on_step_start(self, step: int) -> None:
        self._next_step = step
        self.gc.on_step_start(step)

    def on_step_end(self, step: int) -> int:
        self._next_step = step + 1
        return self.comm.end_step()

    def before_bucket(self, bucket_index: int) -> None:
        if not self._hook_seen:
            # The observer just installed its comm hook (lazily, see wants_comm_hook): from now on
            # its windows measure all transfer, not only the exposed part, so the comm trigger's
            # quiet level must be learnt again (a level that stepped up is not contention).
            self._hook_seen = True
            self._hook_new = True
        self.comm.before(bucket_index)

    # The observer may pass a completion probe to after_bucket (see CommGate): this pacer takes it.
    accepts_completion_probe = True

    def after_bucket(self, bucket_index: int, done: Any = None) -> None:
        self.comm.after(bucket_index, done)

    def on_window(self, step: int, summaries: Sequence[WindowSummary]) -> None:
        if not self.enabled:
            return
        t0 = time.perf_counter()
        limit = self.config.controller_timeout_s
        self.next_window_end = None
        try:
            if self._hook_new:
                self._hook_new = False
                self.controller.reset_transfer_level()
            # On its own thread, waited for at most the limit: a controller that never returned
            # would otherwise hold this rank's training thread, and with it the whole job.
            state, decisions = self._runner.call(lambda: self.controller.update(step, summaries), limit)
        except TimedOut:
            # Slow on this rank alone, typically: the others may start a rebalance trial now and close
            # the open window early (only rebalance trials shorten a window).
            self.window_plan_known = "rebalance" not in self.controller.policies
            self._turn_off(step, f"controller did not return within {limit}s (limit)")
            return
        except Exception as exc:  # the controller must never take training down
            # The same summaries raise the same error on every rank: none of them plans a short window.
            self._turn_off(step, f"controller error: {type(exc).__name__}: {exc}")
            return
        probe = self.controller.next_window_steps
        if probe and state.shares != self._share_values[-1]:
            # The new shares apply from step + 1 + share_lag_steps (``_apply``): the probe counts from
            # there. The open window began where the summarized one ended, so its first steps ran the
            # old shares; the window's medians must speak for the new ones, so the new shares run at
            # least one step more than the old ones did.
            apply = step + 1 + self.share_lag_steps
            start = summaries[0].first_step + summaries[0].steps if summaries else apply
            self.next_window_end = apply + max(int(probe), apply - start + 1)
        elif probe:
            # A re-check of a kept move or the confirmation window before a first move (docs/pacing.md):
            # the shares do not change, the window counts from now.
            self.next_window_end = step + 1 + int(probe)
        dt = time.perf_counter() - t0
        self.controller_s += dt
        if dt > self.config.controller_timeout_s:
            self._turn_off(step, f"controller took {dt:.2f}s (limit {self.config.controller_timeout_s}s)")
            return
        steps = summary_matrix(summaries)[:, WINDOW_FIELDS.index("step_median_ns")]
        self._last_step_time_ns = float(np.median(steps)) if steps.size else 0.0
        self._apply(state, step)
        self.decisions.extend(decisions)
        for d in decisions:
            log.info("pacing step %d: %s %s (%s)", d.step, d.policy, d.action, d.reason)
        if decisions:
            self._write()

    def wants_comm_hook(self) -> bool:
        """True when the comm actuator gates launches in the next window or may in a later one of a
        trial that runs (comm kept, or on trial: a trial starts with the window that proposed it, its
        first ON window is the next one). Checked after each ``on_window``. The observer runs without
        a DDP comm hook until this returns True, installs one then, and removes it once this returns
        False again (a reverted trial): a Python comm hook costs time on every bucket, so a run that
        does not gate should not pay for it. While the hook is installed it is also kept when a new
        comm trial may start at the very next window (no remove-and-reinstall one window apart)."""
        if self.state.comm_window is not None or self.state.comm_spacing_ns > 0:
            return True
        return self.enabled and self.controller.wants_comm(keep=self._hook_installed)

    def set_comm_buckets(self, buckets: int | None) -> None:
        """DDP's bucket count (the same on every rank), from the observer: with no more buckets than the
        in-flight window comm would set, the gate could never hold a launch, and comm is not tried."""
        self.controller.comm_buckets = None if buckets is None else int(buckets)

    def comm_hook_changed(self, installed: bool, step: int, detail: str) -> None:
        """The observer installed (True) or removed (False) its DDP comm hook after ``step``: recorded in
        pacing.parquet; after a removal the comm trigger's quiet level is learnt anew (without the hook
        only exposed transfer is measured, as before the hook)."""
        self._hook_installed = bool(installed)
        if not installed:
            self._hook_seen = False  # a later install restarts the level again (before_bucket)
            self._hook_new = True  # (the level is forgotten at the next on_window)
        what = "installed" if installed else "removed"
        self.decisions.append(Decision(step=step, rank=-1, policy="comm", action="note", value=0.0,
                                       reason=f"DDP comm hook {what} after step {step}: {detail}"))
        self._write()

    def batch_counts(self, global_batch: int, step: int | None = None) -> list[int]:
        """Samples per rank for ``step`` (default: the step about to run); sums to ``global_batch``."""
        k = self._next_step if step is None else step
        i = bisect.bisect_right(self._share_steps, k) - 1
        return counts_from_shares(self._share_values[max(i, 0)], global_batch, self.world_size)

    def batch_offsets(self, global_batch: int, step: int | None = None) -> list[int]:
        return offsets_from_counts(self.batch_counts(global_batch, step))

    def batch_share(self, global_batch: int) -> int:
        return self.batch_counts(global_batch)[self.rank]

    def pin(self, state: PacingState, *, step_time_ns: float = 0.0) -> None:
        """Apply a fixed state from now on and stop the controller (a user's explicit choice, e.g.
        ``PacingState(gc_interval=50)``); ``step_time_ns`` sizes the comm delay budget."""
        self.enabled = False
        self.off_reason = "pinned"
        self._last_step_time_ns = float(step_time_ns)
        self.gc.apply(state.gc_interval, state.gc_full_interval)
        self.comm.apply(
            state.comm_window, state.comm_spacing_ns, int(self.config.max_delay_share * step_time_ns)
        )
        self.state = state
        if state.shares != self._share_values[-1]:
            self._share_steps.append(
                self._share_steps[-1] + 1 if self._share_steps[-1] >= self._next_step else self._next_step
            )
            self._share_values.append(state.shares)
        self.decisions.append(
            Decision(
                step=self._next_step,
                rank=-1,
                policy="guard",
                action="keep",
                value=0.0,
                reason=f"pinned by the user: {state}",
            )
        )

    def status(self) -> str:
        if not self.enabled:
            return f"pacing: {'pinned' if self.off_reason == 'pinned' else 'off'} ({self.off_reason})"
        text = self.controller.describe()
        if self.decisions:
            text += f" | {self.decisions[-1].reason}"
        return text

    def close(self, *, wait: bool = True) -> None:
        self.gc.close()
        self.comm.apply(None, 0, 0)
        self._runner.close()
        self._write()
        if self._log is not None:
            self._log.close() if wait else self._log.close(timeout_s=0)

    def close_nowait(self) -> None:
        """Close when pacing is dropped mid-run, on the training thread: the decision log's writer
        finishes on its own thread instead of holding the step (and every peer) while it writes."""
        self.close(wait=False)

    # -------------------------------------------------------------------------------- internals
    def _apply(self, state: PacingState, step: int) -> None:
        self.state = state
        self.gc.apply(state.gc_interval, state.gc_full_interval)
        budget = int(self.config.max_delay_share * self._last_step_time_ns)
        self.comm.apply(state.comm_window, state.comm_spacing_ns, budget)
        if state.shares != self._share_values[-1]:
            at = step + 1 + self.share_lag_steps
            if at <= self._share_steps[-1]:
                at = self._share_steps[-1] + 1
            self._share_steps.append(at)
            self._share_values.append(state.shares)

    def _turn_off(self, step: int, reason: str) -> None:
        log.warning("pacing turned off on rank %d: %s", self.rank, reason)
        self.enabled = False
        self.off_reason = reason
        self._apply(PacingState(), step)
        self.decisions.append(
            Decision(
                step=step,
                rank=self.rank,
                policy="guard",
                action="off",
                value=0.0,
                reason=f"pacing off: {reason}",
            )
        )
        self._write()

    def _write(self) -> None:
        """Hand the decisions made since the last call to rank 0's log (one queue put: the other ranks
        are already in the next step's all-reduce, and any wait here would stall all of them and look
        like a slow window to the guard)."""
        if self._log is None:
            return
        new, self._written = self.decisions[self._written:], len(self.decisions)
        self._log.add(new)


def write_decisions(run_dir: str | Path, decisions: Sequence[Decision]) -> Path:
    """Write RUN_DIR/pacing.parquet atomically with ``decisions`` (the simulator's whole run at once)."""
    from fabricpace.run.writer import write_table_atomic

    return write_table_atomic(Path(run_dir) / "pacing.parquet", decisions_table(decisions))


def hosts_from_env(world_size: int, env: Mapping[str, str] | None = None) -> int | None:
    """1 when the launcher says every rank runs on this host (torchrun's ``LOCAL_WORLD_SIZE``, Open
    MPI's ``OMPI_COMM_WORLD_LOCAL_SIZE`` equal to the world size; Slurm's ``SLURM_STEP_NUM_NODES`` or
    ``SLURM_NNODES`` of 1), more than 1 when it says otherwise, None when it says nothing. Every rank
    reads the same answer from its own launcher, so every rank's controller has the same policies."""
    e = os.environ if env is None else env

    def num(key: str) -> int | None:
        try:
            return int(e[key])
        except (KeyError, ValueError):
            return None

    for key in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        local = num(key)
        if local is not None and local > 0:
            return 1 if local >= world_size else -(-world_size // local)
    for key in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES"):
        nodes = num(key)
        if nodes is not None and nodes > 0:
            return nodes
    return None


def make_pacer(
    pacing: str | Sequence[str],
    *,
    rank: int,
    world_size: int,
    run_dir: str | Path | None,
    window: int,
    config: PacingConfig | None = None,
    leaves: Sequence[int] | None = None,
    hosts: int | None = None,
) -> Pacer:
    """Build the pacer the observer drives (``pacing`` is "auto", "off", "gc,comm" or a list).
    ``hosts``: hosts the ranks run on (default: what the launcher says, ``hosts_from_env``)."""
    return Pacer(
        pacing, rank=rank, world_size=world_size, run_dir=run_dir, window=window, config=config,
        leaves=leaves, hosts=hosts if hosts is not None else hosts_from_env(world_size),
    )
