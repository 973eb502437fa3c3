"""Live status: one line per window on rank 0's stderr, and optional Prometheus metrics (127.0.0.1 only).

Both read only the gathered window summaries, so they cost nothing between windows.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from fabricpace.run.window import WINDOW_FIELDS, WindowSummary, summary_matrix


def window_stats(summaries: Sequence[WindowSummary], wall_ns: float | None = None) -> dict[str, float]:
    """Fleet view of one window: throughput, CV of step time, slowest rank, wait share.

    ``wall_ns``: the wall time the window covered on rank 0, the time between steps included
    (``Observer._note_wall``). The rates — ``throughput`` (samples/s, all ranks) and ``steps_per_s`` —
    are over it, so a loop that spends half its time in evaluation or checkpoints between steps shows
    half the rate it reaches inside steps; ``in_step_share`` is the share of that wall time inside
    steps. Without it (no step rows on rank 0) the rates are over the summed step time and
    ``rate_over_wall`` is 0. ``samples_given`` is 0 when no rank passed ``samples=`` (throughput NaN)."""
    m = summary_matrix(summaries)  # (the gathered matrix itself: no per-rank objects at 16k ranks)
    if not len(m):
        return {"window": 0.0, "first_step": 0.0, "steps": 0.0, "throughput": float("nan"),
                "steps_per_s": 0.0, "in_step_share": float("nan"), "rate_over_wall": 0.0,
                "samples_given": 0.0, "step_ms": 0.0, "cv": 0.0, "slowest_rank": 0.0,
                "slowest_last_share": 0.0, "wait_share": 0.0}
    col = {name: m[:, i] for i, name in enumerate(WINDOW_FIELDS)}
    step_mean, last = col["step_mean_ns"], col["last_arrivals"]
    mean_step = float(step_mean.mean())
    steps = float(col["steps"][0])
    over_wall = wall_ns is not None and wall_ns > 0
    span_ns = float(wall_ns) if wall_ns is not None and over_wall else mean_step * steps
    # The share inside steps compares rank 0's own step time with rank 0's wall time (another
    # rank's longer steps — a slow first step — would make it exceed 100%).
    r0 = np.flatnonzero(col["rank"] == 0)
    i0 = int(r0[0]) if r0.size else 0
    in_steps_ns = float(step_mean[i0] * col["steps"][i0])
    samples = float((col["samples_mean"] * col["steps"]).sum())  # every rank's samples in the window
    given = samples > 0
    slowest = int(np.argmax(last)) if last.sum() > 0 else int(np.argmax(col["compute_median_ns"]))
    total = max(float(col["collectives"].mean()), 1.0)
    return {
        "window": float(col["window"][0]),
        "first_step": float(col["first_step"][0]),
        "steps": steps,
        "throughput": (samples / (span_ns / 1e9) if span_ns > 0 else 0.0) if given else float("nan"),
        "steps_per_s": steps / (span_ns / 1e9) if span_ns > 0 else 0.0,
        "in_step_share": min(1.0, in_steps_ns / span_ns) if over_wall else float("nan"),
        "rate_over_wall": 1.0 if over_wall else 0.0,
        "samples_given": 1.0 if given else 0.0,
        "step_ms": mean_step / 1e6,
        "cv": float(np.sqrt((col["step_std_ns"] ** 2).mean()) / mean_step) if mean_step > 0 else 0.0,
        "slowest_rank": float(col["rank"][slowest]),
        "slowest_last_share": float(last[slowest] / total) if last.sum() > 0 else 0.0,
        "wait_share": float(col["wait_mean_ns"].mean() / mean_step) if mean_step > 0 else 0.0,
    }


def status_line(stats: dict[str, float], pacing: str) -> str:
    """``... | 1860.3 samples/s | in steps 49% | step ...``: the rate over the window's wall time and
    the share of it inside steps; ``12.4 steps/s (samples not given)`` when no rank passed
    ``samples=``; ``samples/s in steps`` when the wall time is unknown (rate over step time only)."""
    wall = stats.get("rate_over_wall", 0.0) > 0
    if stats.get("samples_given", 1.0) > 0:
        rate = f"{stats['throughput']:.1f} samples/s" + ("" if wall else " in steps")
    else:
        rate = f"{stats['steps_per_s']:.1f} steps/s" + ("" if wall else " in steps") + " (samples not given)"
    share = f" | in steps {stats['in_step_share']:.0%}" if wall else ""
    return (
        f"fabricpace | window {int(stats['window'])} (steps {int(stats['first_step'])}+{int(stats['steps'])})"
        f" | {rate}{share} | step {stats['step_ms']:.2f} ms | CV {stats['cv']:.3f}"
        f" | slowest rank {int(stats['slowest_rank'])} (last {stats['slowest_last_share']:.0%})"
        f" | wait {stats['wait_share']:.0%} | {pacing}"
    )


def print_status(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Metrics:
    """Prometheus gauges served by prometheus-client on 127.0.0.1:port from rank 0."""

    def __init__(self, port: int) -> None:
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        self.registry = CollectorRegistry()
        self.fleet = {
            key: Gauge(f"fabricpace_{key}", help_, registry=self.registry)
            for key, help_ in (
                ("throughput", "samples per second over the last window's wall time, time between "
                               "steps included (all ranks; NaN when no rank passes samples=)"),
                ("steps_per_s", "steps per second over the last window's wall time"),
                ("in_step_share", "share of the last window's wall time inside steps (rank 0)"),
                ("step_ms", "mean step time over the last window, ms"),
                ("cv", "coefficient of variation of step time over the last window"),
                ("wait_share", "share of step time blocked on collectives"),
                ("slowest_rank", "rank that arrived last most often in the last window"),
                ("window", "index of the last window"),
            )
        }
        self.per_rank = {
            key: Gauge(f"fabricpace_rank_{key}", help_, ["rank"], registry=self.registry)
            for key, help_ in (
                ("step_ms", "mean step time of the rank, ms"),
                ("wait_ms", "mean wait per step of the rank, ms"),
                ("last_arrivals", "collectives in the window where the rank arrived last"),
            )
        }
        try:
            server = start_http_server(port, addr="127.0.0.1", registry=self.registry)
        except OSError as exc:  # the port is named: "Address already in use" alone did not say which
            raise OSError(exc.errno, f"cannot serve metrics on 127.0.0.1:{port}: {exc.strerror or exc} "
                                     "(pass another metrics_port=, or None)") from None
        self._server: Any = server[0] if isinstance(server, tuple) else None

    def update(self, stats: dict[str, float], summaries: Sequence[WindowSummary]) -> None:
        for key, gauge in self.fleet.items():
            gauge.set(stats[key])
        m = summary_matrix(summaries)
        cols = [WINDOW_FIELDS.index(n) for n in ("rank", "step_mean_ns", "wait_mean_ns", "last_arrivals")]
        for rank, step_ns, wait_ns, last in m[:, cols].tolist():
            label = str(int(rank))
            self.per_rank["step_ms"].labels(label).set(step_ns / 1e6)
            self.per_rank["wait_ms"].labels(label).set(wait_ns / 1e6)
            self.per_rank["last_arrivals"].labels(label).set(last)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
