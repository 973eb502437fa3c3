"""Live status: one line per window on rank 0's stderr, and optional Prometheus metrics (127.0.0.1 only).

Both read only the gathered window summaries, so they cost nothing between windows.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from fabricpace.run.window import WINDOW_FIELDS, WindowSummary, summary_matrix


def window_stats(summaries: Sequence[WindowSummary]) -> dict[str, float]:
    """Fleet view of one window: throughput, CV of step time, slowest rank, wait share."""
    m = summary_matrix(summaries)  # (the gathered matrix itself: no per-rank objects at 16k ranks)
    if not len(m):
        return {"window": 0.0, "first_step": 0.0, "steps": 0.0, "throughput": 0.0, "step_ms": 0.0,
                "cv": 0.0, "slowest_rank": 0.0, "slowest_last_share": 0.0, "wait_share": 0.0}
    col = {name: m[:, i] for i, name in enumerate(WINDOW_FIELDS)}
    step_mean, last = col["step_mean_ns"], col["last_arrivals"]
    mean_step = float(step_mean.mean())
    slowest = int(np.argmax(last)) if last.sum() > 0 else int(np.argmax(col["compute_median_ns"]))
    total = max(float(col["collectives"].mean()), 1.0)
    return {
        "window": float(col["window"][0]),
        "first_step": float(col["first_step"][0]),
        "steps": float(col["steps"][0]),
        "throughput": float(col["samples_mean"].sum() / (mean_step / 1e9)) if mean_step > 0 else 0.0,
        "step_ms": mean_step / 1e6,
        "cv": float(np.sqrt((col["step_std_ns"] ** 2).mean()) / mean_step) if mean_step > 0 else 0.0,
        "slowest_rank": float(col["rank"][slowest]),
        "slowest_last_share": float(last[slowest] / total) if last.sum() > 0 else 0.0,
        "wait_share": float(col["wait_mean_ns"].mean() / mean_step) if mean_step > 0 else 0.0,
    }


def status_line(stats: dict[str, float], pacing: str) -> str:
    return (
        f"fabricpace | window {int(stats['window'])} (steps {int(stats['first_step'])}+{int(stats['steps'])})"
        f" | {stats['throughput']:.1f} samples/s | step {stats['step_ms']:.2f} ms | CV {stats['cv']:.3f}"
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
                ("throughput", "samples per second over the last window (all ranks)"),
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
        server = start_http_server(port, addr="127.0.0.1", registry=self.registry)
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
