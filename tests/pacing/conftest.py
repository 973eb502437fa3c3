"""Fixtures for pacing tests: synthetic window summaries and the real-rank benchmark worker."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from fabricpace.run.window import WindowSummary

ROOT = Path(__file__).resolve().parents[2]


def make_summaries(
    window: int,
    world: int = 4,
    *,
    step_ms: float = 100.0,
    std_ms: float = 1.0,
    steps: int = 50,
    compute_ms: float | list[float] = 60.0,
    samples: float | list[float] = 16.0,
    gc_ms: float | list[float] = 0.0,
    gc_count: float | list[float] = 0.0,
    last: list[float] | None = None,
    transfer_ms: float = 10.0,
    wait_ms: float = 5.0,
    rss: float = 1e9,
) -> list[WindowSummary]:
    """One window of summaries as the observer would all-gather them."""
    comp = compute_ms if isinstance(compute_ms, list) else [compute_ms] * world
    samp = samples if isinstance(samples, list) else [samples] * world
    lasts = last if last is not None else [10.0] * world
    gms = gc_ms if isinstance(gc_ms, list) else [gc_ms] * world
    gcount = gc_count if isinstance(gc_count, list) else [gc_count] * world
    out = []
    for r in range(world):
        out.append(
            WindowSummary(
                rank=r,
                window=window,
                first_step=window * steps,
                steps=steps,
                step_mean_ns=step_ms * 1e6,
                step_median_ns=step_ms * 1e6,
                step_std_ns=std_ms * 1e6,
                compute_median_ns=comp[r] * 1e6,
                compute_per_sample_ns=comp[r] * 1e6 / samp[r],
                wait_mean_ns=wait_ms * 1e6,
                comm_mean_ns=wait_ms * 1e6,
                transfer_mean_ns=transfer_ms * 1e6,
                last_arrivals=lasts[r],
                collectives=float(sum(lasts)),
                data_mean_ns=0.0,
                gc_mean_ns=gms[r] * 1e6,
                gc_count=gcount[r],
                paced_mean_ns=0.0,
                samples_mean=samp[r],
                rss_bytes=rss,
            )
        )
    return out


@pytest.fixture
def summaries():
    return make_summaries


@pytest.fixture(scope="session")
def bench() -> Any:
    """benchmarks/pacing_real.py as a module: its worker is the real gloo workload the tests run."""
    path = ROOT / "benchmarks" / "pacing_real.py"
    spec = importlib.util.spec_from_file_location("fp_pacing_real", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fp_pacing_real"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def launch(gloo_ranks):
    """The root conftest's rank launcher with 240 s per rank (test modules cannot import conftest under
    importlib mode); callers say how many ranks share a host (``local_world``)."""
    return functools.partial(gloo_ranks[0], timeout=240)
