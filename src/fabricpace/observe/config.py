"""Tunables of the in-process observer, in one frozen keyword-only dataclass with sane defaults."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from fabricpace._errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class ObserverConfig:
    """How the observer records, aggregates and protects the job.

    Every timeout bounds a side-channel operation, so a gone peer can stall a step at most that long,
    once: after any failure the observer degrades to a no-op and training continues.
    """

    # Steps per window: one fixed-size all-gather of window summaries every `window` steps.
    window: int = 50
    # A chunk (one Parquet part per table) is handed to the writer once at least `flush_every` steps
    # AND `flush_interval_s` seconds have passed (or `flush_max_steps` steps are buffered): writing a
    # part costs ~1 ms of CPU whatever its size (Parquet's fixed cost), so fast jobs write one part
    # per interval, not per 50 steps. A SIGKILL loses at most the rows since the last part (about
    # `flush_interval_s` plus the step in flight; the interval is checked every `flush_every` steps,
    # and a timer thread asks for a part at the next step end when steps are long). The first part
    # is written after `flush_every` steps regardless of the interval.
    flush_every: int = 50
    flush_interval_s: float = 15.0
    flush_max_steps: int = 5000
    # Every `compact_parts` parts of a rank's steps and collectives are merged into one file
    # (``part-000000-000063.parquet``, run/parts.py) by the writer: a part every 15 s is ~5,800 files
    # per rank and table a day (11.8 million at 1,024 ranks), which shared file systems list slowly.
    # Crash-safe at any instant; 0 = never merge.
    compact_parts: int = 64
    # "thread": a background thread writes chunks (main thread only swaps buffers);
    # "main": the main thread writes them (deterministic, for tests and debugging).
    flush_mode: str = "thread"
    # Recent collectives per rank shipped with each window summary, so every rank can tell who
    # arrived last (see window.py). The gathered tensor has a fixed size regardless of traffic.
    arrival_slots: int = 128
    # Clock alignment: NTP-style round trips per exchange, and re-alignment period in steps
    # (0 = only at start). Re-alignment runs at a window boundary, so it adds no extra sync point.
    clock_rounds: int = 12
    clock_every: int = 500
    # The window all-gather runs asynchronously on gloo's thread and is collected this many steps
    # after the window closed — at the same step on every rank, so pacing decisions stay in lock
    # step. 0 = wait for it at the window boundary (one blocking sync point per window).
    gather_lag_steps: int = 2
    # Side-channel timeouts (seconds): store round trips, the window all-gather, writer shutdown.
    store_timeout_s: float = 20.0
    gather_timeout_s: float = 30.0
    close_timeout_s: float = 10.0
    # How DDP buckets are observed (docs/observer.md, "DDP instrumentation modes"):
    # "grad_hooks": no comm hook — DDP's C++ reduction runs untouched; arrivals come from
    #   post-accumulate-grad hooks (one per bucket), completion is the end of DDP's backward finalize.
    # "hook": a Python comm hook wrapping the all-reduce — per-bucket completion, pacer bucket calls,
    #   but every bucket pays the Python-hook price.
    # "auto" (default): "hook" when a user comm hook is given or pacing names "comm"; otherwise
    #   "grad_hooks", switching to "hook" (once, at a window boundary) when the pacer's
    #   wants_comm_hook() first says it needs bucket calls.
    ddp_instrumentation: str = "auto"
    # Print one status line per window on rank 0 (stderr).
    status_line: bool = True
    # Probe `nvidia-smi topo -m` when present (bounded by this timeout).
    probe_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        # Checked here so a bad config is refused at construction, before training starts: a value
        # that only failed later would turn the observer off in the middle of the job (a negative
        # timeout, for one, made gloo refuse the window group and close drop the last rows).
        for name in ("window", "flush_every", "flush_max_steps", "arrival_slots", "clock_rounds",
                     "gather_lag_steps", "clock_every"):  # fmt: skip
            value = getattr(self, name)
            least = 0 if name in ("gather_lag_steps", "clock_every") else 1
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
                raise ConfigError(f"ObserverConfig.{name} must be a whole number >= {least} (got {value!r})")
        for name in ("flush_interval_s", "store_timeout_s", "gather_timeout_s", "close_timeout_s",
                     "probe_timeout_s"):  # fmt: skip
            value = getattr(self, name)
            zero_ok = name == "flush_interval_s"  # 0 = a part every flush_every steps
            ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or value < 0 or (value == 0 and not zero_ok):
                need = ">= 0" if zero_ok else "> 0"
                raise ConfigError(f"ObserverConfig.{name} must be a number of seconds {need} (got {value!r})")
        cp = self.compact_parts
        if isinstance(cp, bool) or not isinstance(cp, numbers.Integral) or cp < 0 or cp == 1:
            raise ConfigError(f"ObserverConfig.compact_parts must be 0 (never merge) or a whole number >= 2 "
                              f"(got {cp!r})")
        if self.flush_max_steps < self.flush_every:
            raise ConfigError(
                f"ObserverConfig.flush_max_steps must be >= flush_every ({self.flush_every}) "
                f"(got {self.flush_max_steps!r})"
            )
        if self.ddp_instrumentation not in ("auto", "hook", "grad_hooks"):
            raise ConfigError(
                "ObserverConfig.ddp_instrumentation must be 'auto', 'hook' or 'grad_hooks' "
                f"(got {self.ddp_instrumentation!r})"
            )
        if self.flush_mode not in ("thread", "main"):
            raise ConfigError(
                f"ObserverConfig.flush_mode must be 'thread' or 'main' (got {self.flush_mode!r})"
            )
        if not isinstance(self.status_line, bool):
            raise ConfigError(f"ObserverConfig.status_line must be True or False (got {self.status_line!r})")
