"""The pacing hook: how the observer drives a pacer, and how a failing pacer is dropped safely.

``pacing`` is "off" (default), a mode string handed to ``fabricpace.pacing.make_pacer``, or any
object with the ``Pacer`` methods (custom pacers and tests). Every call goes through ``SafePacer``:
the first exception is logged once, the pacer is closed and dropped, and training continues unpaced.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fabricpace._errors import ConfigError
from fabricpace.observe._guard import LOG, Guard
from fabricpace.run.window import WindowSummary


class Pacer(Protocol):
    def on_step_start(self, step: int) -> None: ...
    def on_step_end(self, step: int) -> int: ...
    def before_bucket(self, bucket_index: int) -> None: ...
    def after_bucket(self, bucket_index: int) -> None: ...
    # Optional: def wants_comm_hook(self) -> bool — see fabricpace.observe.ddp_probe.choose_mode.
    def on_window(self, step: int, summaries: Sequence[WindowSummary]) -> None: ...
    def batch_share(self, global_batch: int) -> int: ...
    def status(self) -> str: ...
    def close(self) -> None: ...


_PACER_METHODS = ("on_step_start", "on_step_end", "on_window", "batch_share", "status", "close")


def check_pacing(pacing: Any) -> None:
    """Refuse a ``pacing`` argument that is neither a documented mode nor a pacer object, before
    the job starts: a typo would otherwise leave the whole run unpaced with one log line per rank."""
    from fabricpace.pacing.config import POLICIES, parse_policies

    hint = f"use 'auto', 'off' or a list of {', '.join(POLICIES)}"
    if pacing is None or pacing is False:
        return
    if pacing is True:
        raise ConfigError(f"pacing=True: {hint}")
    if isinstance(pacing, list | tuple) and not all(isinstance(p, str) for p in pacing):
        raise ConfigError(f"pacing={pacing!r}: a list of policy names; {hint}")
    if _policy_spec(pacing) is not None:
        parse_policies(pacing)  # (raises ConfigError naming the unknown policy)
        return
    missing = [m for m in _PACER_METHODS if not callable(getattr(pacing, m, None))]
    if missing:
        raise ConfigError(f"pacing={pacing!r}: not a pacing mode ({hint}) nor a pacer object "
                          f"(it has no {', '.join(missing)})")


def load_pacer(pacing: Any, *, rank: int, world: int, run_dir: Path, window: int) -> Any:
    """The pacer object for ``pacing`` (None when off)."""
    if pacing is None or pacing == "off" or pacing is False:
        return None
    if _policy_spec(pacing) is not None:
        from fabricpace.pacing import make_pacer  # type: ignore[attr-defined]

        return make_pacer(pacing, rank=rank, world_size=world, run_dir=run_dir, window=window)
    return pacing


def _policy_spec(pacing: Any) -> str | None:
    """``pacing`` as a mode string when it is one of the documented forms ("auto", "gc,comm",
    ["gc", "rebalance"]); None for anything else, which is a pacer object."""
    if isinstance(pacing, str):
        return pacing
    if isinstance(pacing, list | tuple) and all(isinstance(p, str) for p in pacing):
        return ",".join(pacing)
    return None


def pacing_mode(pacing: Any) -> str:
    """How the manifest names ``pacing``: the mode string, or the pacer object's class."""
    if pacing is None or pacing is False:
        return "off"
    spec = _policy_spec(pacing)
    return spec if spec is not None else type(pacing).__name__


def equal_share(global_batch: int, rank: int, world: int) -> int:
    """Equal split of the global batch; the first ``global_batch % world`` ranks take one more."""
    base, extra = divmod(int(global_batch), world)
    return base + (1 if rank < extra else 0)


class SafePacer:
    """Calls a pacer; on its first exception logs once, closes it and behaves as 'off' from then on."""

    def __init__(self, pacer: Any, guard: Guard, rank: int, world: int) -> None:
        self.pacer = pacer
        self.guard = guard
        self.rank = rank
        self.world = world
        self.dropped = False  # dropped after its own exception (not by a peer's, not at close)
        # Whether the loop took its batch from obs.batch_share() (shipped in every window vector):
        # rebalance can only move samples in a loop that does.
        self.shares_asked = False
        self._shares_checked = False
        # What was changed about pacing and why (manifest extra), starting with the pacer's own
        # (the real pacer leaves comm out of "auto" on a single host).
        own = getattr(pacer, "notes", None) if pacer is not None else None
        self.notes: list[str] = [str(n) for n in own] if isinstance(own, list) else []

    @property
    def active(self) -> bool:
        return self.pacer is not None

    @property
    def failed_here(self) -> bool:
        """This rank's pacer went off after a failure (its exception, or it turned itself off, e.g.
        a controller update over its time limit) — a rank-local event the other ranks must learn of."""
        if self.dropped:
            return True
        reason = getattr(self.pacer, "off_reason", None) if self.pacer is not None else None
        return reason is not None and reason != "pinned"

    def digest(self) -> float:
        """A number equal on every rank whose pacer holds the same state: the crc32 of the state's
        repr (exact in a float64). 0 when pacing is off or the pacer object keeps no ``state``."""
        state = getattr(self.pacer, "state", None) if self.pacer is not None else None
        if state is None:
            return 0.0
        try:
            return float(zlib.crc32(repr(state).encode()))
        except Exception:  # a state that cannot be printed cannot be compared either
            return 0.0

    def _drop(self, exc: BaseException | str) -> None:
        pacer, self.pacer = self.pacer, None
        self.guard.fail("pacing", exc)
        with contextlib.suppress(Exception):  # it already failed; its close may fail too
            getattr(pacer, "close_nowait", pacer.close)()

    def agree(self, pacing: Any) -> None:
        """``pacing``: (world × 2), each rank's pacer-failed flag and state digest from the window
        gather. Pacing goes off on every rank at the same window when a rank's pacer failed (an
        error, a controller over its time limit) or the states differ: the decisions (batch shares
        above all) would no longer be the same everywhere."""
        if self.pacer is None:
            return
        failed, digest = pacing[:, 0], pacing[:, 1]
        if failed.any():
            self.drop(f"pacing went off on rank {int(np.flatnonzero(failed)[0])}")
        elif (digest != digest[0]).any():
            k = int(np.flatnonzero(digest != digest[0])[0])
            self.drop(f"pacing states differ between ranks (rank {k}'s is not rank 0's)")
        elif pacing.shape[1] > 2 and not self._shares_checked:
            self._shares_checked = True  # the first window decides, before any pacing decision
            if not pacing[:, 2].all():
                self._leave_out_rebalance(int(np.flatnonzero(pacing[:, 2] == 0)[0]))

    def _leave_out_rebalance(self, rank: int) -> None:
        """The loop does not take its batch from ``obs.batch_share`` (on ``rank``, and typically on
        every rank: the same code): a rebalance decision would move no sample, yet the guard would
        judge it on noise and the decision log would claim it. Leave rebalance out of the policies
        (the same on every rank: all decide from the same gathered flags); the others stay."""
        controller: Any = getattr(self.pacer, "controller", None)
        policies = getattr(controller, "policies", None)
        if not isinstance(policies, tuple) or "rebalance" not in policies:
            return
        kept = tuple(p for p in policies if p != "rebalance")
        controller.policies = kept
        if isinstance(getattr(self.pacer, "policies", None), tuple):
            self.pacer.policies = kept
        note = (f"rebalance left out: rank {rank}'s loop does not take its batch from "
                "obs.batch_share(global_batch), so no sample could move "
                f"(pacing keeps {', '.join(kept) or 'none'})")
        self.notes.append(note)
        if self.rank == 0:
            LOG.warning("fabricpace pacing: %s", note)

    def stop(self, reason: str) -> None:
        """Turn pacing off on this rank for a reason that is no failure (``Guard.stop``)."""
        if self.pacer is not None:
            pacer, self.pacer = self.pacer, None
            self.guard.stop("pacing", reason)
            with contextlib.suppress(Exception):
                getattr(pacer, "close_nowait", pacer.close)()

    def drop(self, reason: str) -> None:
        """Turn pacing off on this rank: another rank's pacer failed, or the ranks' states differ
        (logged once)."""
        if self.pacer is not None:
            self._drop(reason)

    def on_step_start(self, step: int) -> None:
        if self.pacer is not None:
            try:
                self.pacer.on_step_start(step)
            except Exception as exc:
                self.dropped = True
                self._drop(exc)

    def on_step_end(self, step: int) -> int:
        if self.pacer is not None:
            try:
                return max(0, int(self.pacer.on_step_end(step) or 0))
            except Exception as exc:
                self.dropped = True
                self._drop(exc)
        return 0

    def before_bucket(self, index: int) -> None:
        if self.pacer is not None:
            try:
                self.pacer.before_bucket(index)
            except Exception as exc:
                self.dropped = True
                self._drop(exc)

    def after_bucket(self, index: int, done: Any = None) -> None:
        """``done``: the bucket's completion probe (a CUDA event), for pacers that take one; others
        get the plain call, as the Pacer protocol has it."""
        if self.pacer is not None:
            try:
                if done is not None and getattr(self.pacer, "accepts_completion_probe", False):
                    self.pacer.after_bucket(index, done)
                else:
                    self.pacer.after_bucket(index)
            except Exception as exc:
                self.dropped = True
                self._drop(exc)

    def wants_comm_hook(self) -> bool:
        """The pacer's ``wants_comm_hook()`` (CONTRACTS.md, session 2); False when it has none."""
        fn = getattr(self.pacer, "wants_comm_hook", None) if self.pacer is not None else None
        if fn is None:
            return False
        try:
            return bool(fn())
        except Exception as exc:
            self.dropped = True
            self._drop(exc)
            return False

    def on_window(self, step: int, summaries: Sequence[WindowSummary]) -> None:
        if self.pacer is not None:
            try:
                self.pacer.on_window(step, summaries)
            except Exception as exc:
                self.dropped = True
                self._drop(exc)

    def next_window(self) -> tuple[bool, int | None]:
        """(known, end) for the window now open, decided at the last ``on_window``: ``end`` is the
        count of ended steps at which to close it early (None = the usual length). ``known`` is False
        when this rank's pacer failed in that call in a way its peers' need not have: they may close
        the window early, and this rank cannot know when."""
        if self.pacer is None:
            return True, None
        end = getattr(self.pacer, "next_window_end", None)
        known = bool(getattr(self.pacer, "window_plan_known", True))
        return known, (int(end) if end is not None else None)

    def batch_counts(self, global_batch: int, step: int | None = None) -> list[int]:
        """Samples per rank (BalancedSampler and ``find_batch_counts`` reach the pacer through here,
        so taking the batch this way counts as taking it from the pacer, like ``batch_share``)."""
        self.shares_asked = True
        fn = getattr(self.pacer, "batch_counts", None) if self.pacer is not None else None
        if fn is not None:
            try:
                return [int(v) for v in fn(global_batch, step)]
            except Exception as exc:
                self.dropped = True
                self._drop(exc)
        return [equal_share(global_batch, r, self.world) for r in range(self.world)]

    def batch_share(self, global_batch: int) -> int:
        self.shares_asked = True
        if self.pacer is not None:
            try:
                return int(self.pacer.batch_share(global_batch))
            except Exception as exc:
                self.dropped = True
                self._drop(exc)
        return equal_share(global_batch, self.rank, self.world)

    def status(self) -> str:
        if self.pacer is not None:
            try:
                return str(self.pacer.status())
            except Exception as exc:
                self.dropped = True
                self._drop(exc)
        return "pacing off"

    def close(self) -> None:
        if self.pacer is not None:
            pacer, self.pacer = self.pacer, None
            try:
                pacer.close()
            except Exception as exc:
                self.guard.fail("pacing", exc)
