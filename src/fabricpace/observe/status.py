"""Live status: one line per window on rank 0's stderr, and optional Prometheus metrics (127.0.0.1 only).

Both read only the gathered window summaries, so they cost nothing between windows.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from fabricpace.run.window import WindowSummary


def window_stats(summaries: list[WindowSummary]) -> dict[str, float]:
    """Fleet view of one window: throughput, CV of step time, slowest rank, wait share."""
    step_mean = np.array([s.step_mean_ns for s in summaries])
    step_std = np.array([s.step_std_ns for s in summaries])
    samples = np.array([s.samples_mean for s in summaries])
    wait = np.array([s.wait_mean_ns for s in summaries])
    last = np.array([s.last_arrivals for s in summaries])
    compute = np.array([s.compute_median_ns for s in summaries])
    mean_step = float(step_mean.mean()) if step_mean.size else 0.0
    slowest = int(np.argmax(last)) if last.sum() > 0 else int(np.argmax(compute))
    total = max(sum(s.collectives for s in summaries) / max(len(summaries), 1), 1.0)
    return {
        "window": float(summaries[0].window) if summaries else 0.0,
        "first_step": float(summaries[0].first_step) if summaries else 0.0,
        "steps": float(summaries[0].steps) if summaries else 0.0,
        "throughput": float(samples.sum() / (mean_step / 1e9)) if mean_step > 0 else 0.0,
        "step_ms": mean_step / 1e6,
        "cv": float(np.sqrt((step_std**2).mean()) / mean_step) if mean_step > 0 else 0.0,
        "slowest_rank": float(slowest),
        "slowest_last_share": float(last[slowest] / total) if last.sum() > 0 else 0.0,
        "wait_share": float(wait.mean() / mean_step) if mean_step > 0 else 0.0,
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

    def update(self, stats: dict[str, float], summaries: list[WindowSummary]) -> None:
        for key, gauge in self.fleet.items():
            gauge.set(stats[key])
        for s in summaries:
            label = str(s.rank)
            self.per_rank["step_ms"].labels(label).set(s.step_mean_ns / 1e6)
            self.per_rank["wait_ms"].labels(label).set(s.wait_mean_ns / 1e6)
            self.per_rank["last_arrivals"].labels(label).set(s.last_arrivals)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
