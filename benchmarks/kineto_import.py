"""Kineto trace import: MB/s and peak memory against file size, fabricpace vs HolisticTraceAnalysis.

For each size a synthetic single-rank PyTorch-profiler trace is written in the real layout
(``fabricpace.importers.synthetic``: ProfilerStep annotations, cpu ops, runtime launches, GEMM and NCCL
kernels with their metadata args, flow events). Each measurement runs in a fresh subprocess that
reports its wall time, its CPU time (user + system, robust to other load on a shared machine) and its
peak RSS (``ru_maxrss`` of itself and of any children it spawned), so one tool's heap never inflates
the other's number. Runs alternate between the tools (A/B, B/A, ...) and
the table shows medians over the repeats. ``baseline`` is the RSS after importing the libraries and
before touching the trace; ``peak − baseline`` is what the trace itself costs.

    python benchmarks/kineto_import.py                      # 50, 200, 500 MB; 2 repeats
    python benchmarks/kineto_import.py --sizes 20,50 --repeats 3 --no-hta

HolisticTraceAnalysis (PyPI ``HolisticTraceAnalysis``, the ``bench`` extra) loads with its default
JSON parser backend (``TraceAnalysis(trace_dir=...)``); ``--hta-backend ijson_batch_and_compress``
selects its iterative backend instead.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BYTES_PER_STEP = 86_000  # of a synthetic step with 100 kernels (measured), to size the files


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _peak_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) / 1024  # ru_maxrss is KiB on Linux


def child(tool: str, trace_dir: Path, out: Path, backend: str | None) -> None:
    """Runs in the measured subprocess: import the libraries, then time one load of the trace."""
    if tool == "fabricpace":
        from fabricpace.importers.kineto import import_kineto

        base = _rss_mb()
        c0, t0 = _cpu_s(), time.perf_counter()
        import_kineto(trace_dir, out)
        seconds, cpu = time.perf_counter() - t0, _cpu_s() - c0
    else:
        import logging

        logging.disable(logging.CRITICAL)
        from hta.configs.parser_config import ParserBackend, ParserConfig
        from hta.trace_analysis import TraceAnalysis

        if backend:
            cfg = ParserConfig.get_default_cfg()
            cfg.set_parser_backend(ParserBackend(backend))
            ParserConfig.set_default_cfg(cfg)
        base = _rss_mb()
        c0, t0 = _cpu_s(), time.perf_counter()
        TraceAnalysis(trace_dir=str(trace_dir))
        seconds, cpu = time.perf_counter() - t0, _cpu_s() - c0
    print(json.dumps({"seconds": seconds, "cpu_s": cpu, "peak_mb": _peak_mb(), "baseline_mb": base}))


def measure(tool: str, trace_dir: Path, work: Path, backend: str | None, timeout: float) -> dict[str, float]:
    """One load in a fresh process; a run past ``timeout`` seconds is reported as such (inf), not dropped."""
    out = work / f"run-{tool}-{time.monotonic_ns()}"
    cmd = [sys.executable, __file__, "--child", tool, str(trace_dir), str(out)]
    if backend:
        cmd += ["--hta-backend", backend]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        shutil.rmtree(out, ignore_errors=True)
        inf = float("inf")
        return {"seconds": inf, "cpu_s": inf, "peak_mb": float("nan"), "baseline_mb": float("nan")}
    shutil.rmtree(out, ignore_errors=True)
    if r.returncode != 0:
        raise SystemExit(f"{tool} failed on {trace_dir}:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def write_trace(folder: Path, size_mb: int) -> Path:
    from fabricpace.importers.synthetic import SyntheticJob, write_job

    folder.mkdir(parents=True, exist_ok=True)
    steps = max(2, int(size_mb * 1e6 / BYTES_PER_STEP))
    job = SyntheticJob(world_size=1, steps=steps, kernels_per_step=100, buckets_per_step=4)
    return write_job(folder, job)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="50,200,500", help="trace sizes in MB")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-hta", action="store_true", help="measure fabricpace only")
    ap.add_argument("--hta-backend", default=None, help="HTA parser backend (default: its default, json)")
    ap.add_argument("--workdir", default=None, help="where to write the traces (default: a temp dir)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="cap on one load in seconds (shown as inf)")
    ap.add_argument("--child", nargs=3, metavar=("TOOL", "DIR", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]), Path(args.child[2]), args.hta_backend)
        return
    tools = ["fabricpace"] if args.no_hta else ["fabricpace", "hta"]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="kineto-bench-"))
    results: dict[tuple[int, str], list[dict[str, float]]] = {}
    sizes = [int(s) for s in args.sizes.split(",")]
    hta_name = f"HTA ({args.hta_backend or 'json'})"
    print(f"Kineto import, median of {args.repeats} interleaved runs per size (one fresh process each)\n")
    print("| trace MB | tool | wall s | MB/s (wall) | CPU s | MB per CPU-s | peak RSS MB "
          "| peak − baseline MB | CPU vs HTA | memory vs HTA |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)
    try:
        for size in sizes:
            path = write_trace(work / f"{size}MB", size)
            actual = path.stat().st_size / 1e6
            print(f"# wrote {path} ({actual:.0f} MB)", file=sys.stderr, flush=True)
            for rep in range(args.repeats):
                order = tools if rep % 2 == 0 else tools[::-1]
                for tool in order:
                    backend = args.hta_backend if tool == "hta" else None
                    m = measure(tool, path.parent, work, backend, args.timeout)
                    results.setdefault((size, tool), []).append(m)
                    note = (f"# {size} MB {tool}: {m['seconds']:.2f} s wall, {m['cpu_s']:.2f} s CPU, "
                            f"peak {m['peak_mb']:.0f} MB")
                    print(note, file=sys.stderr, flush=True)
            path.unlink()
            med = {}
            for tool in tools:
                runs = results[(size, tool)]
                med[tool] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            for tool in tools:  # a size's rows as soon as it is done: partial results survive
                m = med[tool]
                speed = actual / m["seconds"]
                extra = m["peak_mb"] - m["baseline_mb"]
                ratio_s = ratio_m = ""
                if tool == "fabricpace" and "hta" in med:
                    hta_cpu = med["hta"]["cpu_s"]
                    ratio_s = f"{hta_cpu / m['cpu_s']:.1f}× less"
                    if hta_cpu == float("inf"):
                        ratio_s = "HTA timed out"
                    hta_extra = med["hta"]["peak_mb"] - med["hta"]["baseline_mb"]
                    ratio_m = f"{extra / hta_extra:.3f}×" if hta_extra > 0 else ""
                name = hta_name if tool == "hta" else "fabricpace"
                print(f"| {actual:.0f} | {name} | {m['seconds']:.2f} | {speed:.1f} | {m['cpu_s']:.2f} | "
                      f"{actual / m['cpu_s']:.1f} | {m['peak_mb']:.0f} | {extra:.0f} | {ratio_s} "
                      f"| {ratio_m} |", flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
