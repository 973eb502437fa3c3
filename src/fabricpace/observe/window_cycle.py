"""The observer's window cycle: what happens every ``window`` steps, between two steps.

``close_window`` builds this rank's window vector (``windows.local_vector`` plus three pacing floats)
and starts one fixed-size all-gather of it on the observer's private gloo group, asynchronously;
``finish_gather`` collects it ``gather_lag_steps`` steps later — at the same step on every rank, so
the controllers all read the same matrix — and ``use_window`` hands the summaries to the pacer, the
window log, rank 0's status line and Prometheus gauges, and the clock re-alignment. Functions over
the ``Observer`` (they read and set its scheduling fields); ``observer.py`` calls ``close_window``
and ``finish_gather`` from its between-step events and at close.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fabricpace.observe import ddp_instrument, gather_wait, windows
from fabricpace.run.window import WindowSummary

if TYPE_CHECKING:
    from fabricpace.observe.observer import Observer

# Floats appended to each rank's window vector for pacing: failed flag, state digest, batch_share used.
PACING_FIELDS = 3


def close_window(obs: Observer) -> None:
    """Close a window: build this rank's vector and start the gather (asynchronous when
    distributed; it is collected `gather_lag_steps` steps later, at the same step on every rank)."""
    if not obs.guard.ok("gather"):
        return
    if obs._pending_gather is not None:
        finish_gather(obs)  # windows shorter than the lag: collect the previous one first
    cfg = obs.config
    try:
        steps, colls = obs.recorder.take_window() if obs.recording else ([], [])  # type: ignore[assignment]
        row = windows.local_vector(rank=obs.rank, window=obs._windows_closed, steps=steps,
                                   colls=colls, base_ns=obs.base_ns, slots=cfg.arrival_slots,
                                   leaf=getattr(obs, "_leaf", -1.0))
        # Two more floats: 1 when this rank's pacer went off after a failure, and a digest of its
        # pacing state. Every rank decides from the same gathered windows, so the states agree;
        # should they not (a rank-local failure, or float results that differ between hosts),
        # every rank drops pacing at the same window and their batch shares agree again.
        # A third: whether this rank's loop takes its batch from obs.batch_share (rebalance needs it).
        vec = np.append(row, [1.0 if obs.pacer.failed_here else 0.0, obs.pacer.digest(),
                              1.0 if obs.pacer.shares_asked else 0.0])
        if obs.rank == 0 and (cfg.status_line or obs._metrics is not None):
            note_wall(obs, obs._windows_closed, steps)
        obs._windows_closed += 1
        if obs.distributed:
            import torch

            if obs._gather_buf is None or obs._gather_buf[0].shape[1] != vec.size:
                # Allocated once: the previous gather is always collected before the next starts.
                big = torch.empty(obs.world, vec.size, dtype=torch.float64)
                obs._gather_buf = (big, list(big.unbind(0)), torch.empty(vec.size, dtype=torch.float64))
            big, out, mine = obs._gather_buf
            mine.numpy()[:] = vec
            work = obs._all_gather(out, mine, group=obs._group, async_op=True)
            obs._pending_gather = (work, big, obs.step_index)
            obs._gather_due = obs._ended + cfg.gather_lag_steps
            if cfg.gather_lag_steps == 0:
                finish_gather(obs)
            return
        summaries = windows.cross_rank(vec[None, :-PACING_FIELDS], cfg.arrival_slots)
    except Exception as exc:
        obs.guard.fail("gather", exc)
        return
    use_window(obs, summaries, vec[None, -PACING_FIELDS:])


def finish_gather(obs: Observer) -> None:
    """Wait for the pending gather (bounded by the group's timeout) and use its summaries."""
    pending, obs._pending_gather = obs._pending_gather, None
    if pending is None or not obs.guard.ok("gather"):
        return
    work, out, _ = pending
    try:
        # Not a plain work.wait(): a peer that stopped observing (DDP Join's uneven inputs, an
        # early close) never joins, and the wait would hold training for gather_timeout_s.
        gone = gather_wait.wait_gather(work, obs.channel if obs.distributed else None,
                                       obs._windows_closed - 1, obs.config.gather_timeout_s)
        if gone is not None:
            # Every remaining rank gives up at this same gather (none can complete it), so pacing
            # goes off at the same step everywhere and the ranks' decisions still agree.
            if gone.startswith("the window gather did not complete"):
                obs.guard.fail("gather", gone)
                obs.pacer.drop("window summaries stopped: " + gone)
            else:  # a peer left (Join, an early close): no failure, the summaries just end
                obs.guard.stop("gather", gone)
                obs.pacer.stop("no more window summaries")
            return
        matrix = out.numpy()  # (world × length): summary fields, arrival block, PACING_FIELDS
        summaries = windows.cross_rank(matrix[:, :-PACING_FIELDS], obs.config.arrival_slots)
    except Exception as exc:
        obs.guard.fail("gather", exc)
        return
    use_window(obs, summaries, matrix[:, -PACING_FIELDS:])


def use_window(obs: Observer, summaries: Sequence[WindowSummary], pacing: Any = None) -> None:
    """``pacing``: (world × 3) per rank, its pacer-failed flag, its state digest and whether its
    loop takes the batch from ``obs.batch_share``."""
    cfg = obs.config
    if pacing is not None:
        obs.pacer.agree(pacing)
    obs.summaries = summaries
    obs.window_history.append(summaries)
    if obs._window_log is not None:
        obs._window_log.add(summaries)
    obs._window_index += 1
    obs.pacer.on_window(obs.step_index, summaries)
    plan_window(obs)
    if obs._lazy_hook:
        ddp_instrument.maybe_install_hook(obs)
    if obs.rank == 0:
        report(obs, summaries)
    if (obs._clock_jobs is not None and cfg.clock_every > 0
            and (obs.step_index + 1) % cfg.clock_every < cfg.window):
        obs._clock_jobs.put(obs._window_index)


def plan_window(obs: Observer) -> None:
    """Close the open window early when the pacer asks (a rebalance trial's short first ON window;
    every rank's controller decides the same). A rank whose pacer failed alone in this window
    cannot know whether its peers close early: it leaves the window gathers, as a rank that
    joined under DDP's Join does, so their next gather ends at once instead of waiting for a
    contribution that would come at another step (with DDP between them, never)."""
    known, end = obs.pacer.next_window()
    if not known and obs.distributed:
        obs._joined("pacing failed on this rank alone")
        obs.guard.stop("gather", "pacing failed on this rank; window summaries end here")
        obs.pacer.drop("its controller did not return in time on this rank")
    elif end is not None and end < obs._next_window:
        obs._next_window = max(obs._ended + 1, end)
        obs._next_event = min(obs._next_event, obs._next_window)


def note_wall(obs: Observer, window: int, steps: Any) -> None:
    """Rank 0, once per window: the wall time the window covered, from the previous window's last
    step end (the first window: its first step's start) to its last step end. The time between
    steps (evaluation, checkpoints, logging) is in it, so the status line's rate is the job's
    real rate, not the rate while inside steps. Two stamps read from the window's step rows."""
    if not len(steps):  # nothing recorded in this window: the next one counts from its own start
        obs._last_window_end = None
        return
    first, last = int(steps[0][1]), int(steps[-1][2])
    start = obs._last_window_end if obs._last_window_end is not None else first
    obs._last_window_end = last
    walls = obs._window_walls
    walls[window] = last - start
    if len(walls) > 8:  # windows whose summaries never arrived (a failed gather)
        del walls[min(walls)]


def report(obs: Observer, summaries: Sequence[WindowSummary]) -> None:
    from fabricpace.observe.status import print_status, status_line, window_stats

    if not obs.config.status_line and obs._metrics is None:
        return  # nobody reads the fleet view
    try:
        wall = obs._window_walls.pop(int(summaries[0].window), None) if len(summaries) else None
        stats = window_stats(summaries, wall)
        if obs.config.status_line:
            print_status(status_line(stats, obs.pacer.status()))
        if obs._metrics is not None:
            obs._metrics.update(stats, summaries)
    except Exception as exc:
        obs.guard.fail("status", exc)
