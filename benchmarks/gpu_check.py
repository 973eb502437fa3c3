"""GPU check of the observer's CUDA path: one prepared script for a short lease of one GPU.

    python benchmarks/gpu_check.py --out "$OUT"            # on the GPU machine (see gpu_check.sh)
    .venv/bin/python benchmarks/gpu_check.py --cpu --quick  # here: every item that runs without CUDA

Each item runs in its own subprocess with a timeout, so one failing or hanging item never stops the
others; the results go to OUT/gpu_check.json (per item: status pass/fail/skipped, the checks, the
measured numbers) and a short summary to stdout. Items:

* ``env`` — Python, torch, CUDA, NCCL versions, the GPU, ``nvidia-smi topo -m``, the observer's
  locality probe (GPU PCI id and its NUMA node), the packages fabricpace needs.
* ``events`` (CUDA) — ``EventTimeline`` against real CUDA events: the start-up calibration error,
  the anchor chain against the host clock over many steps and after an idle gap (drift), events on
  another stream, the cost of a stamp/query/elapsed_time, what an unrecorded event answers.
* ``datastall`` (CUDA) — a data phase measured in device time: the host sleeps inside
  ``obs.phase("data")`` while a long kernel runs (expect data ≈ 0, compute ≈ the kernel), and after
  the queue drained (expect data ≈ the sleep); the host durations the old code subtracted are
  reported beside them. On ``--cpu`` the same code runs against ``FakeEventSource``'s device queue.
* ``gate1`` — the comm gate on NCCL: one rank, hook mode, a user comm hook adding ~1 ms of device
  work to every bucket, fabricpace's pacer pinned to one bucket in flight vs the same run ungated;
  gated buckets enter only after the previous one's exit (the gate releases on the CUDA event
  recorded in the completion callback, since NCCL completes the future at enqueue); parameters
  bitwise equal.
* ``nccl1`` — one NCCL rank (gloo on ``--cpu``), DDP with ``fabricpace.observe`` in its default mode:
  run directory written; steps and collectives non-empty with sane times; the step end resolved
  from its CUDA event against the host time the loop saw; ``fabricpace diagnose`` and ``report``
  on it; gradients bitwise equal to an unobserved run (and an unobserved control run).
* ``hook1`` — the same with ``ddp_instrumentation="hook"``; also measures when a pacer's
  ``after_bucket`` runs compared with the bucket's device completion.
* ``gloo2`` / ``gloo4`` — 2 and 4 ranks sharing the one GPU through gloo with CUDA tensors, observe
  with ``pacing="auto"`` and a slow rank (extra GPU work; a sleep on ``--cpu``), beside a
  ``pacing="off"`` arm: completes, the diagnosis names the slow rank, parameters equal to ``off``
  (bitwise unless a rebalance acted, then allclose(1e-5, 1e-6): docs/pacing.md).
* ``overhead`` — interleaved A/B of single-rank steps with and without the observer: median per-cycle
  ratio with a bootstrap CI (the statistics of benchmarks/observer_overhead.py), n reported.
* ``capture`` (CUDA) — an observer stamp taken inside a CUDA graph capture: does the capture
  survive, and what do the captured events answer afterwards.
* ``compile`` — a ``torch.compile``d DDP model observed in the default mode (skipped by ``--quick``).

``--cpu`` forces CPU tensors and gloo even where CUDA exists, and marks CUDA-only checks
"skipped: no CUDA"; it exists so this script is debugged before device time is spent on it.
Imports: torch, numpy, polars and fabricpace only (plus the standard library).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ITEMS = ("env", "events", "datastall", "nccl1", "hook1", "gate1", "gloo2", "gloo4", "overhead", "capture",
         "compile")
# Seconds per item (full run, --quick). The full run must end within ~4 minutes on one H200.
TIMEOUTS = {"env": (60, 40), "events": (60, 30), "datastall": (45, 30), "nccl1": (90, 60),
            "hook1": (60, 40), "gate1": (60, 40), "gloo2": (75, 50),
            "gloo4": (90, 60), "overhead": (60, 40), "capture": (40, 30), "compile": (150, 120)}


# ----------------------------------------------------------------------------------- helpers
def _ensure_fabricpace() -> str:
    """Import fabricpace from the working tree when it is not installed; returns where it came from."""
    try:
        import fabricpace
    except ImportError:
        sys.path.insert(0, str(REPO / "src"))
        import fabricpace
    return str(Path(fabricpace.__file__).parent)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Result:
    """One item's outcome: checks (name -> bool) gate the status; numbers and notes inform."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.checks: dict[str, bool] = {}
        self.numbers: dict[str, Any] = {}
        self.notes: list[str] = []
        self.skip: str | None = None

    def check(self, name: str, ok: Any, value: Any = None) -> bool:
        self.checks[name] = bool(ok)
        if value is not None:
            self.numbers[name] = value
        return bool(ok)

    def to_json(self) -> dict[str, Any]:
        if self.skip is not None:
            status = "skipped"
        else:
            status = "pass" if self.checks and all(self.checks.values()) else "fail"
        failed = [k for k, v in self.checks.items() if not v]
        return {"status": status, "reason": self.skip or (f"failed: {', '.join(failed)}" if failed else ""),
                "checks": self.checks, "numbers": self.numbers, "notes": self.notes}


def _cuda(cpu: bool) -> bool:
    import torch

    return (not cpu) and torch.cuda.is_available()


def _device(a: argparse.Namespace) -> tuple[bool, Any]:
    """(CUDA in use, the device): cuda:0 made current on a GPU run, the CPU on --cpu or without CUDA."""
    import torch

    cuda = _cuda(a.cpu)
    if cuda:
        torch.cuda.set_device(0)
    return cuda, torch.device("cuda:0" if cuda else "cpu")


def _need_cuda(r: Result, a: argparse.Namespace) -> bool:
    """True when this CUDA-only item can run; else marks it skipped (--cpu) or failed (GPU run)."""
    if _cuda(a.cpu):
        return True
    if a.cpu:
        r.skip = "skipped: no CUDA (--cpu)"
    else:
        r.check("cuda_available", False)
    return False


def _gpu_expected(r: Result, a: argparse.Namespace) -> None:
    """A GPU run (no --cpu) without CUDA fails the item, even though its CPU path still runs."""
    import torch

    if not a.cpu and not torch.cuda.is_available():
        r.check("cuda_available", False)


def _mlp(hidden: int, layers: int, d_in: int = 64, seed: int = 0) -> Any:
    import torch

    torch.manual_seed(seed)
    mods: list[Any] = [torch.nn.Linear(d_in, hidden), torch.nn.ReLU()]
    for _ in range(layers - 1):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods, torch.nn.Linear(hidden, 16))


def _sync(dev: Any) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _cli(args: list[str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """The real `fabricpace` entry point in a subprocess (works without an installed console script)."""
    code = "import sys; from fabricpace.cli.app import main; sys.argv[0] = 'fabricpace'; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, env=os.environ.copy())


def _init_world1(backend: str) -> None:
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)


def _bootstrap_median(values: Any, n: int = 5000) -> tuple[float, float]:
    """95% percentile-bootstrap CI of the median (benchmarks/observer_overhead.py's, when importable)."""
    import numpy as np

    rng = np.random.default_rng(0)
    try:
        sys.path.insert(0, str(HERE))
        from observer_overhead import _bootstrap

        return _bootstrap(np.asarray(values, dtype=np.float64), rng, n)
    except ImportError:
        v = np.asarray(values, dtype=np.float64)
        meds = np.median(v[rng.integers(0, v.size, size=(n, v.size))], axis=1)
        return float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


# ----------------------------------------------------------------------------------- a. env
def item_env(r: Result, a: argparse.Namespace) -> None:
    import importlib

    import torch

    from fabricpace.observe import locality

    r.numbers.update(python=sys.version.split()[0], executable=sys.executable, torch=torch.__version__,
                     torch_path=str(Path(torch.__file__).parent), fabricpace=_ensure_fabricpace(),
                     cuda_build=torch.version.cuda, cuda_available=torch.cuda.is_available())
    missing = []
    versions = {}
    for mod in ("numpy", "polars", "pyarrow", "pydantic", "yaml", "typer", "rich", "plotly",
                "prometheus_client"):
        try:
            versions[mod] = getattr(importlib.import_module(mod), "__version__", "?")
        except Exception as exc:
            missing.append(f"{mod} ({type(exc).__name__})")
    r.numbers["packages"] = versions
    r.notes.extend(f"missing: {m}" for m in missing)
    # plotly only draws `fabricpace report`; everything else needs the rest.
    r.check("packages_for_observe_and_diagnose", not [m for m in missing if not m.startswith("plotly")])
    r.check("torch_distributed_available", torch.distributed.is_available())
    topo = locality.nvidia_topo(10.0)
    r.numbers["nvidia_smi"] = shutil.which("nvidia-smi")
    r.numbers["nvidia_topo_lines"] = None if topo is None else len(topo.splitlines())
    if topo:
        r.numbers["nvidia_topo_head"] = topo.splitlines()[:4]
    if not _cuda(a.cpu):
        r.numbers["cuda"] = "skipped: no CUDA" if a.cpu else "CUDA not available"
        if not a.cpu:
            r.check("cuda_available", False)
        return
    props = torch.cuda.get_device_properties(0)
    r.numbers.update(gpu=props.name, capability=list(torch.cuda.get_device_capability(0)),
                     gpu_memory_gib=round(props.total_memory / 2**30, 1), gpus=torch.cuda.device_count(),
                     nccl=_nccl_version(),
                     nccl_available=torch.distributed.is_nccl_available())
    r.check("cuda_available", True)
    r.check("nccl_available", torch.distributed.is_nccl_available())
    r.check("nvidia_smi_topo", bool(topo))
    torch.cuda.set_device(0)
    info = locality.gpu_info(0)
    r.numbers["locality_gpu_info"] = info
    # The observer's probe builds the PCI address from torch's device properties and reads its NUMA
    # node from sysfs; a wrong format would leave gpu_numa null on every GPU machine.
    pci = info.get("gpu_pci")
    r.check("locality_gpu_pci", pci is not None, pci)
    r.numbers["sysfs_pci_path_exists"] = bool(pci) and Path(f"/sys/bus/pci/devices/{pci}").exists()
    r.numbers["props_pci"] = {k: getattr(props, k, None)
                              for k in ("pci_bus_id", "pci_device_id", "pci_domain_id")}
    if not r.numbers["sysfs_pci_path_exists"]:
        r.notes.append("sysfs has no /sys/bus/pci/devices/<gpu_pci> here (a VM may hide it): "
                       "gpu_numa stays null")


def _nccl_version() -> str | None:
    import torch

    try:
        v = torch.cuda.nccl.version()
    except Exception as exc:
        return f"unknown ({type(exc).__name__})"
    return ".".join(map(str, v)) if isinstance(v, tuple | list) else str(v)


# ----------------------------------------------------------------------------------- events
def item_events(r: Result, a: argparse.Namespace) -> None:
    """On CUDA: the checks against real events. On --cpu: skipped, but the same checks run against
    clocks.FakeEventSource (a device lagging the host) so that this item's own code is exercised
    before device time is spent on it; those figures say nothing about a GPU."""
    import torch

    from fabricpace.observe.clocks import CpuClock, CudaEventSource, EventTimeline, FakeEventSource

    clock = CpuClock()
    if _cuda(a.cpu):
        torch.cuda.set_device(0)
        torch.cuda.synchronize()
        a_mat = [torch.randn(1024, 1024, device="cuda")]

        def work() -> None:
            for _ in range(4):
                a_mat[0] = torch.tanh(a_mat[0] @ a_mat[0] * 1e-3)

        tl = EventTimeline(clock, CudaEventSource())
        _event_checks(r, tl, clock, torch.cuda.synchronize, lambda ev: ev.synchronize(), work, a.quick)
        _event_checks_cuda(r, tl)
        # The same through a source bound to a device (records on that device's current stream).
        bound = Result("events-device-bound")
        tl_dev = EventTimeline(clock, CudaEventSource("cuda:0"))
        _event_checks(bound, tl_dev, clock, torch.cuda.synchronize, lambda ev: ev.synchronize(), work, True)
        _event_checks_cuda(bound, tl_dev)
        r.numbers["device_bound_source"] = bound.to_json()
        r.check("device_bound_source", bound.to_json()["status"] == "pass")
        return
    if not a.cpu:
        r.check("cuda_available", False)
        return
    r.skip = "skipped: no CUDA (--cpu); the item's code ran against a fake device (selftest_*)"
    fake = FakeEventSource(clock.now, lag_ns=200_000)

    def ev_sync(ev: Any) -> None:
        while not ev.query():
            time.sleep(20e-6)

    selftest = Result("events-selftest")
    _event_checks(selftest, EventTimeline(clock, fake), clock, fake.synchronize, ev_sync,
                  lambda: time.sleep(200e-6), True)
    r.numbers["selftest_fake_device"] = selftest.to_json()


def _event_checks(r: Result, tl: Any, clock: Any, sync_all: Any, sync_ev: Any, work: Any,
                  quick: bool) -> None:
    """Calibration, the anchor chain over many steps and one idle gap, hot-path costs, an event
    recorded before its anchor (``tl`` on real CUDA events, or on the fake device for a self-test)."""
    import numpy as np

    # 1. Calibration: an event stamped on an idle device resolves between the host times around it.
    lo, hi = [], []
    for _ in range(50):
        sync_all()
        h0 = clock.now()
        ev = tl.mark()
        sync_ev(ev)
        h1 = clock.now()
        t = tl.resolve(ev)
        assert t is not None
        lo.append(t - h0)
        hi.append(h1 - t)
    lo_a, hi_a = np.asarray(lo), np.asarray(hi)
    r.numbers["calib_t_minus_host_before_us"] = [round(float(np.median(lo_a)) / 1e3, 2),
                                                  round(float(lo_a.min()) / 1e3, 2)]
    r.numbers["calib_host_after_minus_t_us"] = [round(float(np.median(hi_a)) / 1e3, 2),
                                                 round(float(hi_a.min()) / 1e3, 2)]
    r.check("calibration_within_50us", lo_a.min() > -50_000 and hi_a.min() > -50_000)
    # 2. The anchor chain: per "step" an anchor, some device work, an end event; the step end is
    # resolved through the chain and compared with the host time right after it completed.
    errs, when = [], []
    t_stop = time.monotonic() + (1.5 if quick else 10.0)
    gap_s = 0.5 if quick else 2.0
    gap_err: list[float] = []
    k = 0
    while time.monotonic() < t_stop:
        anchor = tl.mark()
        work()
        end = tl.mark()
        sync_ev(end)
        h = clock.now()
        assert tl.resolve_anchor(anchor) is not None
        t = tl.resolve(end)
        assert t is not None
        errs.append(h - t)
        when.append(h)
        k += 1
        if k == 200:  # one idle gap between anchors (an evaluation pause, say)
            time.sleep(gap_s)
            anchor = tl.mark()
            end = tl.mark()
            sync_ev(end)
            h = clock.now()
            tl.resolve_anchor(anchor)
            t2 = tl.resolve(end)
            gap_err.append(float(h - (t2 or 0)))
    e = np.asarray(errs, dtype=np.float64)
    w = (np.asarray(when, dtype=np.float64) - when[0]) / 1e9
    slope = float(np.polyfit(w, e, 1)[0]) if w[-1] > 0 else 0.0  # ns of error per s of run = 1e-3 ppm
    r.numbers.update(chain_steps=len(errs), chain_seconds=round(float(w[-1]), 2),
                     host_minus_resolved_end_us_median=round(float(np.median(e)) / 1e3, 2),
                     host_minus_resolved_end_us_min_max=[round(float(e.min()) / 1e3, 2),
                                                         round(float(e.max()) / 1e3, 2)],
                     drift_ppm=round(slope / 1e3, 3), gap_s=gap_s,
                     after_gap_host_minus_end_us=[round(g / 1e3, 2) for g in gap_err])
    # The resolved end is before the host saw it complete (>= 0) and not far before (< 1 ms), all along.
    r.check("chain_end_before_host", e.min() > -50_000)
    r.check("chain_end_close_to_host", float(np.median(e)) < 1_000_000)
    r.check("chain_drift_below_20ppm", abs(slope) < 20_000)
    r.check("gap_end_before_host", bool(gap_err) and min(gap_err) > -50_000)
    # 3. Cost of the hot-path calls (host µs).
    n = 2000
    t0 = time.perf_counter_ns()
    evs = [tl.mark() for _ in range(n)]
    t1 = time.perf_counter_ns()
    for e_ in evs:
        e_.query()
    t2 = time.perf_counter_ns()
    sync_all()
    t3 = time.perf_counter_ns()
    for e_ in evs:
        evs[0].elapsed_time(e_)
    t4 = time.perf_counter_ns()
    r.numbers.update(mark_us=round((t1 - t0) / n / 1e3, 3), query_us=round((t2 - t1) / n / 1e3, 3),
                     elapsed_time_us=round((t4 - t3) / n / 1e3, 3))
    # 4. An event recorded before the anchor: elapsed_time's sign (records entered between steps).
    before = tl.mark()
    anchor = tl.mark()
    sync_all()
    tl.resolve_anchor(anchor)
    tb = tl.resolve(before)
    r.numbers["before_anchor_minus_anchor_ns"] = None if tb is None else int(tb - tl._anchor_ns)
    r.check("before_anchor_resolves_earlier", tb is not None and tb <= tl._anchor_ns)


def _event_checks_cuda(r: Result, tl: Any) -> None:
    """What only real CUDA events can answer: another stream, an event never recorded."""
    import torch

    anchor = tl.mark()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        ev = tl.mark()
    torch.cuda.synchronize()
    tl.resolve_anchor(anchor)
    r.check("cross_stream_resolves", tl.resolve(ev) is not None)
    fresh = torch.cuda.Event(enable_timing=True)
    r.numbers["unrecorded_query"] = bool(fresh.query())
    try:
        anchor.elapsed_time(fresh)
        r.numbers["unrecorded_elapsed_time"] = "no error"
    except Exception as exc:
        r.numbers["unrecorded_elapsed_time"] = f"{type(exc).__name__}: {str(exc)[:120]}"


# ----------------------------------------------------------------------------------- datastall
# Busy arm: a 30 ms kernel, then 10 ms of host "loading" inside obs.phase("data"). Idle arm: the queue
# drained first, 10 ms of loading, then a 5 ms kernel.
_STALL_KERNEL_BUSY_NS, _STALL_KERNEL_IDLE_NS, _STALL_SLEEP_S = 30_000_000, 5_000_000, 0.010


def item_datastall(r: Result, a: argparse.Namespace) -> None:
    """The step's data time on the event timeline is device time between two stream stamps. On CUDA
    with real kernels (``torch.cuda._sleep``, calibrated); on --cpu: skipped, but the same loop runs
    against clocks.FakeEventSource's device queue (``enqueue_work`` stands for the kernel)."""
    import torch

    from fabricpace.observe.clocks import CpuClock, CudaEventSource, FakeEventSource

    if _cuda(a.cpu):
        torch.cuda.set_device(0)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        cycles = 20_000_000
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        per_ms = cycles / float(start.elapsed_time(end))
        r.numbers["sleep_kernel_cycles_per_ms"] = round(per_ms)

        def launch(ns: int) -> None:
            torch.cuda._sleep(int(per_ms * ns / 1e6))

        _data_stall(r, a, CudaEventSource("cuda:0"), launch, torch.cuda.synchronize, "cuda")
        return
    if not a.cpu:
        r.check("cuda_available", False)
        return
    r.skip = "skipped: no CUDA (--cpu); the item's code ran against a fake device queue (selftest)"
    fake = FakeEventSource(CpuClock().now, lag_ns=100_000)
    selftest = Result("datastall-selftest")
    _data_stall(selftest, a, fake, fake.enqueue_work, fake.synchronize, "fake")
    r.numbers["selftest_fake_device"] = selftest.to_json()


def _data_stall(r: Result, a: argparse.Namespace, source: Any, launch: Any, drain: Any, tag: str) -> None:
    import numpy as np
    import polars as pl

    from fabricpace import load_run
    from fabricpace.observe import Observer, ObserverConfig

    steps = 12 if a.quick else 30
    sleep_ns = _STALL_SLEEP_S * 1e9
    for arm in ("busy", "idle"):
        obs = Observer(None, Path(a.work) / "runs" / f"datastall-{arm}-{tag}",
                       config=ObserverConfig(status_line=False, flush_mode="main"), event_source=source)
        with obs:
            for _ in range(steps):
                with obs.step(samples=1):
                    if arm == "busy":
                        launch(_STALL_KERNEL_BUSY_NS)  # asynchronous: the GPU works ~30 ms
                        with obs.phase("data"):
                            time.sleep(_STALL_SLEEP_S)  # the host loads the next batch meanwhile
                    else:
                        drain()  # nothing queued: the GPU waits for the host
                        with obs.phase("data"):
                            time.sleep(_STALL_SLEEP_S)
                        launch(_STALL_KERNEL_IDLE_NS)
        r.check(f"{arm}_observer_no_failures", not obs.failures, obs.failures or None)
        run = load_run(obs.run_dir)
        st = run.steps.sort("step").filter(pl.col("step") >= 1)  # the first step warms up
        host = run.ops.filter(pl.col("op") == "data").sort("step").filter(pl.col("step") >= 1)
        r.check(f"{arm}_all_steps", st.height == steps - 1 and host.height == steps - 1, st.height)
        data = st["data_ns"].to_numpy()
        span = (st["t_end_ns"] - st["t_start_ns"]).to_numpy()
        compute = st["compute_ns"].to_numpy()
        host_data = host["dur_ns"].to_numpy()

        def ms(v: Any) -> float:
            return round(float(np.median(v)) / 1e6, 3)

        r.numbers[arm] = {"steps": int(st.height), "data_ms": ms(data),
                          "data_ms_max": round(float(data.max()) / 1e6, 3), "host_data_ms": ms(host_data),
                          "span_ms": ms(span), "compute_ms": ms(compute),
                          "compute_with_host_data_ms (old)": ms(np.maximum(0, span - host_data))}
        r.numbers[f"{arm}_data_ms"] = ms(data)
        if arm == "busy":
            r.check("busy_host_did_load", float(np.median(host_data)) >= 0.95 * sleep_ns)
            r.check("busy_data_near_zero", float(np.median(data)) < 0.1 * sleep_ns, ms(data))
            r.check("busy_compute_is_the_kernel", float(np.median(compute)) >= 0.9 * _STALL_KERNEL_BUSY_NS,
                    ms(compute))
        else:
            r.check("idle_data_is_the_sleep", 0.9 * sleep_ns <= float(np.median(data))
                    <= float(np.median(host_data)) + 1e6, ms(data))
            r.check("idle_compute_is_the_kernel", 0.9 * _STALL_KERNEL_IDLE_NS <= float(np.median(compute))
                    <= _STALL_KERNEL_IDLE_NS + 2e6, ms(compute))
    # Host cost of a data phase on the event timeline (two stamps, then two queries and two
    # elapsed_time reads when its step resolves): empty steps with and without one, interleaved.
    obs = Observer(None, Path(a.work) / "runs" / f"datastall-cost-{tag}",
                   config=ObserverConfig(status_line=False, flush_mode="main"), event_source=source)
    per: dict[bool, list[float]] = {False: [], True: []}
    with obs:
        for block in range(22 if a.quick else 62):
            with_phase = block % 2 == 1
            t0 = time.perf_counter_ns()
            for _ in range(100):
                with obs.step(samples=1):
                    if with_phase:
                        with obs.phase("data"):
                            pass
            if block >= 2:  # the first pair warms up
                per[with_phase].append((time.perf_counter_ns() - t0) / 100)
    r.numbers["step_us_without_data_phase"] = round(float(np.median(per[False])) / 1e3, 2)
    r.numbers["step_us_with_data_phase"] = round(float(np.median(per[True])) / 1e3, 2)
    r.numbers["data_phase_added_us"] = round(float(np.median(per[True]) - np.median(per[False])) / 1e3, 2)
    r.check("cost_observer_no_failures", not obs.failures, obs.failures or None)


# ----------------------------------------------------------------------------------- b / e
class _TimingPacer:
    """A pacer object that only records when the observer calls it (host perf_counter_ns)."""

    def __init__(self) -> None:
        self.before: list[tuple[int, int]] = []
        self.after: list[tuple[int, int]] = []
        self.step = -1

    def on_step_start(self, step: int) -> None:
        self.step = step

    def on_step_end(self, step: int) -> int:
        return 0

    def before_bucket(self, index: int) -> None:
        self.before.append((self.step, time.perf_counter_ns()))

    def after_bucket(self, index: int) -> None:
        self.after.append((self.step, time.perf_counter_ns()))

    def on_window(self, step: int, summaries: list[Any]) -> None:
        pass

    def batch_share(self, global_batch: int) -> int:
        return global_batch

    def status(self) -> str:
        return "timing"

    def close(self) -> None:
        pass


def _one_rank(r: Result, a: argparse.Namespace, mode: str) -> None:
    """b (mode "auto": the default, hook-free) and e (mode "hook") on one rank."""
    _gpu_expected(r, a)
    import numpy as np
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from fabricpace.observe import ObserverConfig, observe
    from fabricpace.run.reader import load_run

    cuda, dev = _device(a)
    backend = "nccl" if cuda else "gloo"
    _init_world1(backend)
    r.numbers.update(backend=backend, device=str(dev), torch=torch.__version__)
    hidden, layers, batch = (1024, 6, 256) if cuda else (128, 4, 32)
    steps = 24 if a.quick else 60
    bucket_mb = 1.0 if cuda else 0.02
    gen = torch.Generator().manual_seed(7)
    data = [(torch.randn(batch, 64, generator=gen).to(dev), torch.randn(batch, 16, generator=gen).to(dev))
            for _ in range(steps)]

    def run(obs_mode: str | None, run_dir: Path) -> tuple[list[Any], Any, list[tuple[int, int, int]]]:
        model = DDP(_mlp(hidden, layers).to(dev), bucket_cap_mb=bucket_mb)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        grads: list[Any] = []
        host: list[tuple[int, int, int]] = []  # (step, host time inside the step after its last sync, after)
        obs = None
        pacer = _TimingPacer() if obs_mode == "hook" else None
        if obs_mode is not None:
            cfg = ObserverConfig(status_line=False, flush_mode="main", ddp_instrumentation=obs_mode)
            obs = observe(model, run_dir=run_dir, window=10, config=cfg, pacing=pacer or "off")
        for i, (x, y) in enumerate(data):
            ctx = obs.step(samples=batch) if obs is not None else None
            if ctx is not None:
                ctx.__enter__()
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()
                                    if p.grad is not None]).cpu())
            opt.step()
            float(loss.item())  # a host sync inside the step: the device is idle when the step ends
            h_in = time.perf_counter_ns()
            if ctx is not None:
                ctx.__exit__(None, None, None)
            host.append((i, h_in, time.perf_counter_ns()))
        if obs is not None:
            obs.close()
        return grads, (obs, pacer), host

    base = Path(a.work) / "runs"
    plain, _, _ = run(None, base / "unused")
    seen, (obs, pacer), host = run(mode, base / f"{r.name}")
    control, _, _ = run(None, base / "unused")
    bitwise = all(torch.equal(p, q) for p, q in zip(plain, seen, strict=True))
    control_ok = all(torch.equal(p, q) for p, q in zip(plain, control, strict=True))
    maxdiff = max(float((p - q).abs().max()) for p, q in zip(plain, seen, strict=True))
    r.numbers.update(steps=steps, ddp_mode=obs.ddp_mode, failures=obs.failures, grad_max_abs_diff=maxdiff,
                     unobserved_runs_bitwise_equal=control_ok, timeline=type(obs.recorder.timeline).__name__)
    if not control_ok:
        r.notes.append("two unobserved runs differ: this device is not deterministic here, so the bitwise "
                       "comparison says nothing; grad_max_abs_diff is the figure to read")
    r.check("gradients_bitwise_equal_unobserved", bitwise or not control_ok)
    r.check("observer_no_failures", not obs.failures)
    r.check("ddp_mode", obs.ddp_mode == ("grad_hooks" if mode == "auto" else "hook"), obs.ddp_mode)
    r.check("event_timeline_on_cuda", (type(obs.recorder.timeline).__name__ == "EventTimeline") == cuda)
    run_dir = Path(obs.run_dir)
    data_ = load_run(run_dir)
    st, co = data_.steps.sort("step"), data_.collectives
    r.numbers.update(run_dir=str(run_dir), step_rows=st.height, collective_rows=co.height,
                     manifest_complete=bool(data_.manifest.complete), warnings=data_.warnings)
    r.check("manifest_complete", data_.manifest.complete)
    r.check("steps_all_rows", st.height == steps, st.height)
    r.check("collectives_nonempty", co.height > 0, co.height)
    if st.height == 0:
        return
    t0, t1 = st["t_start_ns"].to_numpy(), st["t_end_ns"].to_numpy()
    comp = st["compute_ns"].to_numpy()
    r.check("compute_positive", bool((comp > 0).all()), int(comp.min()))
    r.check("t_end_ge_t_start", bool((t1 >= t0).all()))
    r.check("steps_in_order", bool((t0[1:] >= t1[:-1] - 1_000).all()))  # 1 µs: resolution of elapsed_time
    r.numbers["step_ms_median"] = round(float(np.median(t1 - t0)) / 1e6, 3)
    r.numbers["wait_ms_median"] = round(float(np.median(st["wait_ns"].to_numpy())) / 1e6, 4)
    if co.height:
        enter, exit_ = co["t_enter_ns"].to_numpy(), co["t_exit_ns"].to_numpy()
        r.check("collectives_exit_known", co["t_exit_ns"].null_count() == 0, co["t_exit_ns"].null_count())
        ok = exit_ >= enter
        r.check("collectives_exit_ge_enter", bool(ok.all()), int((~ok).sum()))
        j = co.join(st.select("step", "t_start_ns", "t_end_ns"), on="step")
        inside = ((j["t_enter_ns"] >= j["t_start_ns"] - 1_000) & (j["t_exit_ns"] <= j["t_end_ns"] + 1_000))
        r.check("collectives_within_their_step", bool(inside.all()), int((~inside).sum() or 0))
        r.numbers["buckets_per_step"] = int(co.group_by("step").len()["len"].to_numpy().max())
    # The step end resolved from its device event vs the host clock around the end of the step: the
    # loop synchronized just before, so the end event ran at once (host h_in .. h_out).
    h = np.asarray(host, dtype=np.int64)
    t_end_abs = t1 + int(obs.base_ns)
    early = t_end_abs - h[:, 1]  # >= 0 expected (the end stamp is taken after h_in)
    late = h[:, 2] - t_end_abs  # >= 0 expected
    r.numbers["end_minus_host_in_us"] = [round(float(np.median(early)) / 1e3, 2),
                                         round(float(early.min()) / 1e3, 2)]
    r.numbers["host_out_minus_end_us"] = [round(float(np.median(late)) / 1e3, 2),
                                          round(float(late.min()) / 1e3, 2)]
    tol = 100_000  # 100 µs: the calibration's one synchronize and elapsed_time's resolution
    r.check("step_end_matches_host_clock", bool((early > -tol).all() and (late > -tol).all()))
    if pacer is not None and co.height:
        # When does after_bucket run, compared with the bucket's completion (t_exit)? On gloo the
        # future's callback runs once the work finished; on NCCL when it was enqueued (PyTorch's
        # CUDA future), i.e. possibly before the transfer ran on the GPU.
        after = np.asarray([t for _, t in pacer.after], dtype=np.int64) - int(obs.base_ns)
        ex = np.sort(co.sort(["step", "seq"])["t_exit_ns"].to_numpy())
        n = min(after.size, ex.size)
        if n:
            gap = ex[-n:] - np.sort(after)[-n:]
            r.numbers["exit_minus_after_bucket_us_median"] = round(float(np.median(gap)) / 1e3, 2)
            r.numbers["after_bucket_before_device_completion_share"] = round(float((gap > 1_000).mean()), 3)
            r.notes.append("after_bucket_before_device_completion_share > 0 means the pacer's after_bucket "
                           "(comm gate release) runs before the bucket completed on the device")
    # Diagnose and report on the run, through the real CLI.
    d = _cli(["diagnose", str(run_dir), "--format", "json"])
    diag_ok = d.returncode == 0
    try:
        diag = json.loads(d.stdout) if diag_ok else None
    except json.JSONDecodeError:
        diag, diag_ok = None, False
    r.check("diagnose_runs", diag_ok, None if diag_ok else d.stderr[-400:])
    if diag is not None:
        r.numbers["diagnosis"] = _culprit_summary(diag)
    try:
        import plotly  # noqa: F401
    except ImportError:
        r.notes.append("report: skipped (plotly not installed; run `fabricpace report` on the returned run)")
        return
    html = Path(a.work) / f"{r.name}-report.html"
    rep = _cli(["report", str(run_dir), "--out", str(html)], timeout=120)
    r.check("report_runs", rep.returncode == 0 and html.is_file(),
            None if rep.returncode == 0 else rep.stderr[-400:])


def item_nccl1(r: Result, a: argparse.Namespace) -> None:
    _one_rank(r, a, "auto")


def item_hook1(r: Result, a: argparse.Namespace) -> None:
    _one_rank(r, a, "hook")


def item_gate1(r: Result, a: argparse.Namespace) -> None:
    """The comm gate holds launches until the previous bucket *finished* (NCCL completes a work's
    future at enqueue, so the gate releases on the CUDA event the observer records on the callback's
    stream). One rank, the observer's hook mode, a user comm hook whose callback adds ~1 ms of device
    work to every bucket (world size 1 all-reduces are too short to overlap anything); fabricpace's
    pacer pinned to one bucket in flight, against the same run ungated. Gated: a bucket is entered only
    after the previous one's exit; parameters bitwise equal to the ungated run."""
    _gpu_expected(r, a)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from fabricpace.observe import ObserverConfig, observe
    from fabricpace.pacing import PacingConfig, make_pacer
    from fabricpace.pacing.state import PacingState
    from fabricpace.run.reader import load_run

    cuda, dev = _device(a)
    _init_world1("nccl" if cuda else "gloo")
    hidden, layers, batch = (1024, 6, 256) if cuda else (128, 4, 32)
    steps = 16 if a.quick else 40
    n = 1536 if cuda else 96
    ballast = torch.randn(n, n, device=dev)

    # Unannotated: DDP refuses a hook whose annotations are not the torch types, and under
    # `from __future__ import annotations` they are strings (observe() runs DDP's check too).
    def slow_allreduce(_state, bucket):  # type: ignore[no-untyped-def]
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()

        def then(f: Any) -> Any:
            for _ in range(4 if cuda else 1):  # device work after the transfer, before the completion
                torch.mm(ballast, ballast)
            v = f.value()
            return v[0] if isinstance(v, list) else v

        return fut.then(then)

    gen = torch.Generator().manual_seed(11)
    data = [(torch.randn(batch, 64, generator=gen).to(dev), torch.randn(batch, 16, generator=gen).to(dev))
            for _ in range(steps)]

    def run(gated: bool) -> tuple[Any, Any, Any]:
        model = DDP(_mlp(hidden, layers).to(dev), bucket_cap_mb=1.0 if cuda else 0.02)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        pacer = make_pacer("comm", rank=0, world_size=1, run_dir=None, window=10,
                           config=PacingConfig(max_delay_share=0.5))
        if gated:
            pacer.pin(PacingState(comm_window=1), step_time_ns=10e9)  # budget 5 s a step: never the limit
        cfg = ObserverConfig(status_line=False, flush_mode="main", ddp_instrumentation="hook")
        run_dir = Path(a.work) / "runs" / f"gate1-{'gated' if gated else 'free'}"
        obs = observe(model, run_dir=run_dir, window=10, config=cfg, pacing=pacer,
                      comm_hook=(None, slow_allreduce))
        for x, y in data:
            with obs.step(samples=batch):
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                _sync(dev)
        obs.close()
        params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
        return params, pacer, load_run(obs.run_dir).collectives

    def serialized(co: Any) -> tuple[float, int]:
        """Share of consecutive bucket pairs in a step where the next entered after the last exited."""
        pairs = ok = 0
        for _, g in co.sort("step", "seq").group_by("step", maintain_order=True):
            e, x = g["t_enter_ns"].to_numpy(), g["t_exit_ns"].to_numpy()
            pairs += max(0, e.size - 1)
            ok += int((e[1:] >= x[:-1] - 1_000).sum())
        return (ok / pairs if pairs else float("nan")), pairs

    free_params, free_pacer, free_co = run(False)
    gated_params, gated_pacer, gated_co = run(True)
    s_free, _ = serialized(free_co)
    s_gated, n_gated = serialized(gated_co)
    gate = gated_pacer.comm
    r.numbers.update(backend="nccl" if cuda else "gloo", steps=steps, bucket_pairs=n_gated,
                     serialized_share_ungated=round(s_free, 3), serialized_share_gated=round(s_gated, 3),
                     gate_waits=gate.waits, max_in_flight_seen=gate.max_in_flight_seen,
                     ungated_max_in_flight_seen=free_pacer.comm.max_in_flight_seen)
    r.check("buckets_per_step_at_least_2", n_gated > 0, n_gated)
    r.check("gated_max_in_flight_is_1", gate.max_in_flight_seen == 1)
    r.check("gated_buckets_enter_after_previous_exit", s_gated >= 0.9)
    r.check("parameters_bitwise_equal_to_ungated", bool(torch.equal(free_params, gated_params)))
    if s_free >= 0.9:
        r.notes.append("the ungated run was serialized too: the buckets did not overlap, so this run "
                       "cannot show the gate's effect (only that it does no harm)")


# ----------------------------------------------------------------------------------- c
def rank_worker(a: argparse.Namespace) -> None:
    """One rank of the gloo job sharing the one GPU: an `off` arm then an `auto` arm, same data."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from fabricpace.observe import ObserverConfig, observe
    from fabricpace.pacing import sample_weight
    from fabricpace.pacing.sampler import find_batch_counts

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    cuda, dev = _device(a)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=world)
    slow = world - 1
    global_batch, steps, window = 64, (30 if a.quick else 60), 10
    gen = torch.Generator().manual_seed(1234)
    n_data = global_batch * 8
    data_x = torch.randn(n_data, 64, generator=gen).to(dev)
    data_y = torch.randn(n_data, 16, generator=gen).to(dev)
    heavy = torch.randn(2048, 2048, device=dev) if cuda else torch.zeros(1)
    reps = 0
    if cuda:  # extra GPU work of ~20 ms per step on the slow rank, calibrated once
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            heavy = torch.tanh(heavy @ heavy * 1e-3)
        torch.cuda.synchronize()
        reps = max(1, int(0.02 / ((time.perf_counter() - t0) / 5)))
    out: dict[str, Any] = {"rank": rank, "reps": reps}
    for arm in ("off", "auto"):
        model = DDP(_mlp(128, 3).to(dev), bucket_cap_mb=0.02)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        cfg = ObserverConfig(status_line=False, flush_every=10, flush_interval_s=0)
        run_dir = Path(a.work) / "runs" / f"{a.tag}-{arm}"
        t_run = time.perf_counter()
        with observe(model, run_dir=run_dir, pacing=arm, window=window, config=cfg) as obs:
            for step in range(steps):
                fn = find_batch_counts(obs)
                counts = fn(global_batch) if fn is not None else None
                if counts is None:
                    counts = [global_batch // world] * world
                n = counts[rank]
                start = (step * global_batch + sum(counts[:rank])) % n_data
                idx = (torch.arange(start, start + n) % n_data).to(dev)
                with obs.step(samples=n):
                    if rank == slow:
                        if cuda:
                            for _ in range(reps):
                                heavy = torch.tanh(heavy @ heavy * 1e-3)
                        else:
                            time.sleep(0.02)
                    loss = torch.nn.functional.mse_loss(model(data_x[idx]), data_y[idx])
                    loss = loss * sample_weight(n, global_batch, world)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
            pacer = getattr(getattr(obs, "pacer", None), "pacer", None)
            decisions = [{"step": d.step, "policy": d.policy, "action": d.action, "reason": d.reason}
                         for d in getattr(pacer, "decisions", [])]
        flat = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()]).cpu()
        out[arm] = {"failures": obs.failures, "ddp_mode": obs.ddp_mode, "run_dir": str(obs.run_dir),
                    "decisions": decisions, "params": flat.tolist(), "seconds": time.perf_counter() - t_run,
                    "timeline": type(obs.recorder.timeline).__name__ if hasattr(obs, "recorder") else None}
        dist.barrier()
    Path(a.result).write_text(json.dumps(out))
    dist.destroy_process_group()


def _gloo_shared(r: Result, a: argparse.Namespace, world: int) -> None:
    _gpu_expected(r, a)
    import numpy as np

    if a.quick and world > 2:
        r.skip = "skipped: --quick runs the 2-rank job only"
        return
    port = _free_port()
    procs, files = [], []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        f = Path(a.work) / f"{r.name}-rank{rank}.json"
        files.append(f)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--rank-worker", "--port", str(port), "--work",
               a.work, "--result", str(f), "--tag", r.name] + (["--cpu"] if a.cpu else []) + (
            ["--quick"] if a.quick else [])
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    deadline = time.monotonic() + TIMEOUTS[r.name][1 if a.quick else 0] - 15
    errs = []
    for rank, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()  # only the ranks this item started
            _, err = p.communicate()
            errs.append(f"rank {rank} timed out")
        if p.returncode:
            errs.append(f"rank {rank} exit {p.returncode}: {err[-600:]}")
    r.check("all_ranks_finished", not errs, errs or None)
    if errs:
        return
    res = [json.loads(f.read_text()) for f in files]
    slow = world - 1
    r.numbers["slow_rank"] = slow
    r.numbers["timeline"] = res[0]["auto"]["timeline"]
    r.numbers["seconds_off_auto"] = [round(res[0]["off"]["seconds"], 2), round(res[0]["auto"]["seconds"], 2)]
    failures = {f"{x['rank']}/{arm}": x[arm]["failures"] for x in res for arm in ("off", "auto")
                if x[arm]["failures"]}
    r.check("observer_no_failures", not failures, failures or None)
    decisions = res[0]["auto"]["decisions"]
    r.numbers["auto_decisions"] = [f"{d['step']}:{d['policy']}/{d['action']}" for d in decisions]
    moved = any(d["policy"] == "rebalance" and d["action"] == "enable" for d in decisions)
    pa_, pb = np.asarray(res[0]["off"]["params"]), np.asarray(res[0]["auto"]["params"])
    r.numbers["params_max_abs_diff"] = float(np.abs(pa_ - pb).max())
    if moved:
        r.check("params_equal_off (allclose: rebalance acted)", np.allclose(pa_, pb, rtol=1e-5, atol=1e-6))
    else:
        r.check("params_equal_off (bitwise)", bool((pa_ == pb).all()))
    for arm in ("auto", "off"):
        d = _cli(["diagnose", res[0][arm]["run_dir"], "--format", "json"])
        if d.returncode != 0:
            r.check(f"diagnose_{arm}_runs", False, d.stderr[-400:])
            continue
        diag = json.loads(d.stdout)
        r.numbers[f"diagnosis_{arm}"] = _culprit_summary(diag)
        if arm == "off":  # the unpaced run shows the slow rank plainly (a paced one may hide it)
            r.check("diagnosis_names_slow_rank", _names_rank(diag, slow))


def _culprit_summary(diag: Any) -> Any:
    """The diagnosis's headline (``fabricpace.diagnosis/1``): verdict, then the first finding's mode,
    culprit ranks and severity."""
    if not isinstance(diag, dict):
        return None
    runs = diag.get("runs") or [{}]
    out: dict[str, Any] = {"verdict": runs[0].get("verdict"), "healthy": diag.get("healthy")}
    findings = diag.get("findings") or []
    if findings:
        f = findings[0]
        out.update(mode=f.get("mode"), ranks=(f.get("culprits") or {}).get("ranks"),
                   severity_pct=f.get("severity_pct"), cause=(f.get("evidence") or {}).get("cause"))
    return out


def _names_rank(diag: Any, rank: int) -> bool:
    """True when the first finding's culprit ranks are exactly ``[rank]``."""
    findings = diag.get("findings") if isinstance(diag, dict) else None
    if not findings:
        return False
    return list((findings[0].get("culprits") or {}).get("ranks") or []) == [rank]


def item_gloo2(r: Result, a: argparse.Namespace) -> None:
    _gloo_shared(r, a, 2)


def item_gloo4(r: Result, a: argparse.Namespace) -> None:
    _gloo_shared(r, a, 4)


# ----------------------------------------------------------------------------------- d
def item_overhead(r: Result, a: argparse.Namespace) -> None:
    _gpu_expected(r, a)
    import numpy as np
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from fabricpace.observe import ObserverConfig, observe

    cuda, dev = _device(a)
    if not cuda:
        torch.set_num_threads(1)
    _init_world1("nccl" if cuda else "gloo")
    hidden, layers, batch = (2048, 6, 256) if cuda else (128, 4, 32)
    pairs = 40 if a.quick else (1000 if cuda else 400)
    x = torch.randn(batch, 64, device=dev)
    y = torch.randn(batch, 16, device=dev)
    models = {arm: DDP(_mlp(hidden, layers).to(dev), bucket_cap_mb=4.0 if cuda else 0.05)
              for arm in ("without", "with")}
    obs = observe(models["with"], run_dir=Path(a.work) / "runs" / "overhead",
                  config=ObserverConfig(status_line=False))

    def step(arm: str) -> int:
        m = models[arm]
        t0 = time.perf_counter_ns()
        if arm == "with":
            with obs.step(samples=batch):
                m.zero_grad(set_to_none=True)
                torch.nn.functional.mse_loss(m(x), y).backward()
                _sync(dev)
        else:
            m.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(m(x), y).backward()
            _sync(dev)
        return time.perf_counter_ns() - t0

    for _ in range(20):
        step("without")
        step("with")
    base, seen = [], []
    for i in range(pairs):  # ABBA: each arm goes first in half of the cycles
        order = ("without", "with") if i % 2 == 0 else ("with", "without")
        t = {arm: step(arm) for arm in order}
        base.append(t["without"])
        seen.append(t["with"])
    obs.close()
    b, s = np.asarray(base, dtype=np.float64), np.asarray(seen, dtype=np.float64)
    ratio = s / b
    lo, hi = _bootstrap_median(ratio)
    dlo, dhi = _bootstrap_median(s - b)
    r.numbers.update(n_pairs=pairs, step_us_without_median=round(float(np.median(b)) / 1e3, 1),
                     step_us_with_median=round(float(np.median(s)) / 1e3, 1),
                     ratio_median=round(float(np.median(ratio)), 4), ratio_ci95=[round(lo, 4), round(hi, 4)],
                     added_us_median=round(float(np.median(s - b)) / 1e3, 2),
                     added_us_ci95=[round(dlo / 1e3, 2), round(dhi / 1e3, 2)], ddp_mode=obs.ddp_mode,
                     what="host wall time of a synchronized step (forward, backward, DDP all-reduce, "
                          "cuda.synchronize), with vs without the observer; per-cycle ratio, ABBA order")
    r.notes.append("within noise" if lo <= 1.0 <= hi else
                   f"observer step cost {100 * (float(np.median(ratio)) - 1):+.2f}% (CI excludes 0)")
    r.check("observer_no_failures", not obs.failures, obs.failures or None)
    r.check("measured", bool(np.isfinite([lo, hi]).all()) and pairs >= 40)


# ----------------------------------------------------------------------------------- capture
def item_capture(r: Result, a: argparse.Namespace) -> None:
    """A stamp inside a CUDA graph capture (a grad hook or comm hook firing while the user captures a
    step), and a query inside one (``Recorder.poll`` when a whole ``obs.step()`` is captured). The
    user's capture must survive both; the observer may lose those stamps (reported)."""
    if not _need_cuda(r, a):
        return
    import torch

    from fabricpace.observe.clocks import CpuClock, CudaEventSource, EventTimeline

    torch.cuda.set_device(0)
    tl = EventTimeline(CpuClock(), CudaEventSource())
    x = torch.ones(1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on a side stream, as torch.cuda.graph's docs ask
        (x * 2 + 1).sum()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()

    def attempt(query: bool) -> tuple[bool, Any]:
        g = torch.cuda.CUDAGraph()
        stamp: list[Any] = []
        info: dict[str, Any] = {}
        try:
            with torch.cuda.graph(g):
                y = x * 2
                try:
                    stamp.append(tl.mark())
                except Exception as exc:
                    info["mark_error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                if query and stamp:
                    try:
                        info["query_returned"] = bool(stamp[0].query())
                    except Exception as exc:
                        info["query_error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                y = y + 1
        except Exception as exc:
            info["capture_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            torch.cuda.synchronize()
            return False, info
        ok = False
        try:
            g.replay()
            torch.cuda.synchronize()
            ok = bool(torch.equal(y, torch.full_like(x, 3.0)))
        except Exception as exc:
            info["replay_error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
        if stamp:  # what Recorder.poll would meet after the capture
            try:
                info["captured_stamp_query_after"] = bool(stamp[0].query())
                tl.resolve_anchor(tl.mark())
                torch.cuda.synchronize()
                info["captured_stamp_resolves_to"] = tl.resolve(stamp[0])
            except Exception as exc:
                info["captured_stamp_error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
        return ok, info

    ok_mark, info_mark = attempt(query=False)
    ok_query, info_query = attempt(query=True)
    r.numbers.update(stamp_in_capture=info_mark, stamp_and_query_in_capture=info_query)
    r.check("user_capture_survives_stamp", ok_mark)
    r.check("user_capture_survives_query", ok_query)


# ----------------------------------------------------------------------------------- compile
def item_compile(r: Result, a: argparse.Namespace) -> None:
    if a.quick:
        r.skip = "skipped: --quick"
        return
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    _gpu_expected(r, a)

    from fabricpace.observe import ObserverConfig, observe
    from fabricpace.run.reader import load_run

    cuda, dev = _device(a)
    _init_world1("nccl" if cuda else "gloo")
    # DDPOptimizer (torch.compile of a DDP module) wants the first bucket (1 MiB) no larger than the cap.
    ddp = DDP(_mlp(512, 4).to(dev), bucket_cap_mb=1.5)
    compiled = torch.compile(ddp)
    x, y = torch.randn(32, 64, device=dev), torch.randn(32, 16, device=dev)
    steps = 20
    t0 = time.perf_counter()
    with observe(ddp, run_dir=Path(a.work) / "runs" / "compile",
                 config=ObserverConfig(status_line=False, flush_mode="main")) as obs:
        for _ in range(steps):
            with obs.step(samples=32):
                ddp.zero_grad(set_to_none=True)
                torch.nn.functional.mse_loss(compiled(x), y).backward()
                _sync(dev)
    r.numbers["seconds"] = round(time.perf_counter() - t0, 1)
    from torch._dynamo.utils import counters

    r.numbers["dynamo_frames_ok"] = int(counters["frames"]["ok"])
    run = load_run(obs.run_dir)
    r.numbers.update(ddp_mode=obs.ddp_mode, failures=obs.failures, step_rows=run.steps.height,
                     collective_rows=run.collectives.height)
    r.check("observer_no_failures", not obs.failures)
    r.check("steps_all_rows", run.steps.height == steps)
    r.check("collectives_nonempty", run.collectives.height > 0)
    r.check("compiled", r.numbers["dynamo_frames_ok"] > 0)


# ----------------------------------------------------------------------------------- driver
def run_item(a: argparse.Namespace) -> None:
    r = Result(a.item)
    t0 = time.perf_counter()
    try:
        _ensure_fabricpace()
        globals()[f"item_{a.item}"](r, a)
    except Exception as exc:
        r.check("no_exception", False)
        r.notes.append("".join(traceback.format_exception(exc))[-2500:])
    out = r.to_json()
    out["seconds"] = round(time.perf_counter() - t0, 2)
    if "torch" in sys.modules:
        out["numbers"].setdefault("torch", sys.modules["torch"].__version__)
    Path(a.result).write_text(json.dumps(out, default=str))


def _orchestrate(a: argparse.Namespace) -> int:
    out = Path(a.out or os.environ.get("OUT") or "gpu_check_out").resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work or tempfile.mkdtemp(prefix="fabricpace-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    items = [i for i in ITEMS if not a.only or i in a.only.split(",")]
    env = dict(os.environ, PYTHONUNBUFFERED="1", CUBLAS_WORKSPACE_CONFIG=":4096:8")
    env.setdefault("NCCL_DEBUG", "WARN")  # an NCCL failure then says why in the item's stderr tail
    if a.cpu:  # on a loaded 2-core host, two spinning OpenMP threads per process stretched steps ~100x
        env.setdefault("OMP_NUM_THREADS", "1")
    src = str(REPO / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    results: dict[str, Any] = {}
    t_all = time.perf_counter()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for name in items:
        limit = TIMEOUTS[name][1 if a.quick else 0]
        if a.budget:  # the whole run must end inside the lease: later items get what is left
            left = a.budget - (time.perf_counter() - t_all)
            if left < 15:
                results[name] = {"status": "skipped", "reason": f"skipped: --budget {a.budget} s spent",
                                 "checks": {}, "numbers": {}, "notes": [], "wall_s": 0.0}
                print(f"[skipped] {name:<9}    0.0 s  {results[name]['reason']}", flush=True)
                continue
            limit = int(min(limit, left))
        res_file = work / f"item-{name}.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--item", name, "--work", str(work),
               "--result", str(res_file)] + (["--cpu"] if a.cpu else []) + (["--quick"] if a.quick else [])
        t0 = time.perf_counter()
        try:
            # A new session: on a timeout the item and everything it started (rank processes) go.
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
            try:
                _, se = p.communicate(timeout=limit)
                timed_out = False
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                _, se = p.communicate()
                timed_out = True
            if res_file.is_file() and not timed_out:
                res = json.loads(res_file.read_text())
            else:
                res = {"status": "fail", "reason": f"timed out after {limit} s" if timed_out else
                       f"exit {p.returncode} without a result", "checks": {}, "numbers": {}, "notes": []}
            if res["status"] == "fail" or p.returncode:
                res["stderr_tail"] = se[-3000:]
        except Exception as exc:  # the orchestrator itself must always write its JSON
            res = {"status": "fail", "reason": f"could not run: {exc!r}", "checks": {}, "numbers": {},
                   "notes": []}
        res["wall_s"] = round(time.perf_counter() - t0, 2)
        results[name] = res
        print(f"[{res['status']:>7}] {name:<9} {res['wall_s']:6.1f} s  {res.get('reason', '')}", flush=True)
    summary = {
        "mode": "cpu" if a.cpu else "gpu", "quick": a.quick, "python": sys.executable,
        "torch": next((v["numbers"]["torch"] for v in results.values() if "torch" in v.get("numbers", {})),
                      None),
        "started_utc": started,
        "wall_s": round(time.perf_counter() - t_all, 1),
        "passed": sorted(k for k, v in results.items() if v["status"] == "pass"),
        "failed": sorted(k for k, v in results.items() if v["status"] == "fail"),
        "skipped": sorted(k for k, v in results.items() if v["status"] == "skipped"),
        "items": results,
    }
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=1, default=str))
    # The run directories travel back (small), so `fabricpace report` can run where plotly is.
    runs = work / "runs"
    if runs.is_dir() and not a.no_tar:
        with tarfile.open(out / "gpu_check_runs.tar.gz", "w:gz") as tar:
            tar.add(runs, arcname="runs")
    print(f"gpu_check: {len(summary['passed'])} pass, {len(summary['failed'])} fail, "
          f"{len(summary['skipped'])} skipped in {summary['wall_s']} s (torch {summary['torch']}); "
          f"{out / 'gpu_check.json'}", flush=True)
    for name, res in results.items():
        nums = res.get("numbers", {})
        keys = [k for k in ("ratio_median", "ratio_ci95", "added_us_median", "n_pairs", "drift_ppm",
                            "host_minus_resolved_end_us_median", "calib_t_minus_host_before_us", "mark_us",
                            "query_us", "busy_data_ms", "idle_data_ms", "data_phase_added_us",
                            "end_minus_host_in_us", "exit_minus_after_bucket_us_median",
                            "diagnosis_off", "params_max_abs_diff", "gpu", "nccl") if k in nums]
        if keys:
            print(f"  {name}: " + ", ".join(f"{k}={nums[k]}" for k in keys), flush=True)
    if not a.keep_work and not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if summary["failed"] else 0


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="CPU tensors and gloo only (CUDA-only checks skipped)")
    p.add_argument("--quick", action="store_true", help="fewer steps and pairs; no 4-rank job, no compile")
    p.add_argument("--out", default="", help="where gpu_check.json goes (default $OUT, else ./gpu_check_out)")
    p.add_argument("--only", default="", help=f"comma-separated items (of {','.join(ITEMS)})")
    p.add_argument("--budget", type=float, default=0,
                   help="seconds for all items together (later items get what is left; 0 = no limit)")
    p.add_argument("--keep-work", action="store_true", help="keep the work folder (run directories)")
    p.add_argument("--no-tar", action="store_true", help="do not pack the run directories into OUT")
    p.add_argument("--work", default="", help=argparse.SUPPRESS)
    p.add_argument("--item", default="", help=argparse.SUPPRESS)
    p.add_argument("--result", default="", help=argparse.SUPPRESS)
    p.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--tag", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main() -> None:
    a = _args()
    if a.rank_worker or a.item:
        _ensure_fabricpace()
        if a.rank_worker:
            rank_worker(a)
        else:
            run_item(a)
        # Results are written; skip interpreter teardown (torch's static destructors can abort while a
        # gloo/NCCL thread winds down, turning a finished item into a failed one).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    sys.exit(_orchestrate(a))


if __name__ == "__main__":
    main()
