"""Observer overhead: the same 4-rank gloo DDP workload with and without the observer, side by side.

    .venv/bin/python benchmarks/observer_overhead.py --pairs 600 --steps 1

One job, three DDP replicas of the same model on the same data: ``without`` (DDP's built-in C++
reduction, no observer), ``with`` (observer on: comm hook, step records, threaded chunk writer,
window gathers every 50 steps) and ``pyhook`` (PyTorch's own Python ``allreduce_hook``, no
observer), which separates the price of any Python comm hook from the observer's own. Each cycle
runs one block of ``--steps`` steps per arm in a rotating order, so drift on this shared machine
hits every arm alike. Per cycle the overhead is median(step with) / median(step without) − 1; the
figure is the median over cycles with a 95% percentile-bootstrap CI (resampling cycles). The
per-step cost in µs is reported the same way, and also measured directly as CPU time: the
observer's hot path (step enter/exit + one record per bucket, amortized finalization and window
summaries) in a tight loop, and the writer thread's CPU per chunk — both far less noisy here.

Step time is rank 0's wall time per step (the all-reduce makes every rank's step the same length).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--pairs", type=int, default=600, help="cycles (one block per arm each; default 600)")
    p.add_argument("--steps", type=int, default=1,
                   help="steps per block (default 1: arms alternate every step, the tightest pairing "
                        "on a noisy shared machine)")
    p.add_argument("--warmup", type=int, default=20, help="unmeasured steps per arm first (default 20)")
    p.add_argument("--realistic", action="store_true",
                   help="a larger step (hidden 1024, batch 256, 2 MB buckets: ~100–140 ms per step here), "
                        "where a fixed per-bucket cost shows the share it has in real jobs")
    p.add_argument("--hidden", type=int, default=None, help="default 512 (1024 with --realistic)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=None, help="samples per rank per step (32; 256 realistic)")
    p.add_argument("--bucket-mb", type=float, default=None, help="DDP bucket cap (0.5; 2 realistic)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window", type=int, default=50, help="observer window in steps (default 50)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    big = a.realistic
    a.hidden = a.hidden if a.hidden is not None else (1024 if big else 512)
    a.batch = a.batch if a.batch is not None else (256 if big else 32)
    a.bucket_mb = a.bucket_mb if a.bucket_mb is not None else (2.0 if big else 0.5)
    return a


def _model(hidden: int, layers: int):  # type: ignore[no-untyped-def]
    import torch

    torch.manual_seed(0)
    mods: list[torch.nn.Module] = [torch.nn.Linear(128, hidden), torch.nn.ReLU()]
    for _ in range(layers - 1):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods, torch.nn.Linear(hidden, 10))


def worker(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from fabricpace.observe import ObserverConfig, observe

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    plain = DDP(_model(a.hidden, a.layers), bucket_cap_mb=a.bucket_mb)
    observed = DDP(_model(a.hidden, a.layers), bucket_cap_mb=a.bucket_mb)
    # Third arm: PyTorch's own Python all-reduce hook, no observer — separates the cost of having any
    # Python comm hook from the observer's own cost.
    pyhook = DDP(_model(a.hidden, a.layers), bucket_cap_mb=a.bucket_mb)
    pyhook.register_comm_hook(None, default_hooks.allreduce_hook)
    gen = torch.Generator().manual_seed(a.seed + rank)
    x = torch.randn(a.batch, 128, generator=gen)
    y = torch.randint(0, 10, (a.batch,), generator=gen)
    run_dir = Path(a.out).parent / "run"
    obs = observe(observed, run_dir=run_dir, window=a.window, config=ObserverConfig(status_line=False))

    def step_plain() -> None:
        plain.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(plain(x), y).backward()

    def step_pyhook() -> None:
        pyhook.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(pyhook(x), y).backward()

    def step_observed() -> None:
        with obs.step(samples=a.batch):
            observed.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(observed(x), y).backward()

    arms = {"without": step_plain, "pyhook": step_pyhook, "with": step_observed}
    for _ in range(a.warmup):
        for fn in arms.values():
            fn()
    # Each cycle runs every arm once, in a rotating order (a Latin square over cycles), so slow drift
    # on this shared machine hits every arm alike.
    orders = [("without", "with", "pyhook"), ("with", "pyhook", "without"), ("pyhook", "without", "with"),
              ("without", "pyhook", "with"), ("with", "without", "pyhook"), ("pyhook", "with", "without")]
    blocks: list[dict[str, object]] = []
    for cycle in range(a.pairs):
        for arm in orders[cycle % len(orders)]:
            fn = arms[arm]
            times = []
            for _ in range(a.steps):
                t0 = time.perf_counter_ns()
                fn()
                times.append(time.perf_counter_ns() - t0)
            blocks.append({"arm": arm, "cycle": cycle, "step_ns": times})
    obs.close()
    if rank == 0:
        Path(a.out).write_text(json.dumps({"blocks": blocks, "failures": obs.failures,
                                           "buckets": len(list(_buckets(run_dir)))}))
    dist.destroy_process_group()


def _buckets(run_dir: Path) -> list[int]:
    """Sequence numbers of the last recorded step's buckets (how many buckets a step has)."""
    try:
        import polars as pl

        c = pl.read_parquet(sorted((run_dir / "collectives" / "rank-00000").glob("part-*.parquet"))[-1])
        return c.filter(pl.col("step") == c["step"].max())["seq"].to_list()
    except Exception:  # a benchmark detail; fall back to one bucket
        return []


def hot_path_cost_ns(buckets: int, n: int = 20000) -> float:
    """CPU time per step of the observer's own work, ns (process CPU time, so load on this shared
    machine inflates it less than wall time): step context, `buckets` records, the amortized
    finalization and window summaries. Chunk encoding is measured separately (`chunk_cost_ns`)."""
    from fabricpace.observe import ObserverConfig, observe

    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        # Default window (50) and flush (50): window summaries and chunk hand-offs are included.
        obs = observe(None, Path(tmp) / "r", config=ObserverConfig(status_line=False))
        rec = obs.recorder

        def loop(observed: bool) -> int:
            t0 = time.process_time_ns()
            for _ in range(n):
                if observed:
                    with obs.step(samples=8):
                        for _ in range(buckets):
                            r = rec.enter("ddp:world", "all_reduce", 1024, False)
                            rec.exit(r)
                else:
                    for _ in range(buckets):
                        pass
            return time.process_time_ns() - t0

        base = min(loop(False) for _ in range(3))
        cost = min(loop(True) for _ in range(3))
        obs.close()
    return (cost - base) / n


def chunk_cost_ns(steps: int, buckets: int, n: int = 20) -> float:
    """CPU time to build and atomically write one chunk (steps + collectives parts), ns."""
    from fabricpace.observe._guard import Guard
    from fabricpace.observe.chunks import ChunkSink

    rows = [(i, i * 100, i * 100 + 90, 5, 3, 2, 0, 0, 0, 8, 0) for i in range(steps)]
    colls = [(i // buckets, i, "ddp:world", "all_reduce", 1000, i * 10, i * 10 + 5)
             for i in range(steps * buckets)]
    with tempfile.TemporaryDirectory() as tmp:
        sink = ChunkSink(Path(tmp), 0, Guard(0), threaded=False)
        sink.submit({"steps": rows, "collectives": colls}, 0)  # warm-up (imports, first file)
        t0 = time.process_time_ns()
        for _ in range(n):
            sink.submit({"steps": rows, "collectives": colls}, 0)
        return (time.process_time_ns() - t0) / n


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bootstrap(values: np.ndarray, rng: np.random.Generator, n: int = 5000) -> tuple[float, float]:
    idx = rng.integers(0, values.size, size=(n, values.size))
    meds = np.median(values[idx], axis=1)
    return float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def main() -> None:
    a = _args()
    if a.worker:
        worker(a)
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        port = _free_port()
        argv = [a for a in sys.argv[1:] if a != "--json"]
        procs = []
        for rank in range(a.world):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(a.world), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, __file__, *argv, "--worker", "--out", str(out)],
                                          env=env))
        codes = [p.wait() for p in procs]
        if any(codes):
            raise SystemExit(f"a worker failed: exit codes {codes}")
        res = json.loads(out.read_text())
    blocks = res["blocks"]
    cycles = sorted({b["cycle"] for b in blocks})
    med = {(b["cycle"], b["arm"]): float(np.median(b["step_ns"])) for b in blocks}
    w_arr = np.array([med[(c, "with")] for c in cycles])
    wo_arr = np.array([med[(c, "without")] for c in cycles])
    py_arr = np.array([med[(c, "pyhook")] for c in cycles])
    pairs = cycles
    ratio = w_arr / wo_arr - 1.0
    diff_us = (w_arr - wo_arr) / 1e3
    rng = np.random.default_rng(0)
    lo, hi = _bootstrap(ratio, rng)
    dlo, dhi = _bootstrap(diff_us, rng)
    py_ratio = py_arr / wo_arr - 1.0
    own_ratio = w_arr / py_arr - 1.0
    plo, phi = _bootstrap(py_ratio, rng)
    olo, ohi = _bootstrap(own_ratio, rng)
    buckets = max(int(res["buckets"]), 1)
    hot_ns = hot_path_cost_ns(buckets)
    chunk_ns = chunk_cost_ns(50, buckets)
    step_ns = float(np.median(wo_arr))
    # One chunk per max(50 steps, 5 s) (ObserverConfig defaults).
    chunk_steps = max(50.0, 5e9 / step_ns)
    result = {
        "world": a.world, "hidden": a.hidden, "layers": a.layers, "batch": a.batch,
        "pairs": len(pairs), "steps_per_block": a.steps,
        "steps_measured_per_arm": len(pairs) * a.steps, "buckets_per_step": buckets,
        "step_ms_without": float(np.median(wo_arr) / 1e6), "step_ms_with": float(np.median(w_arr) / 1e6),
        "overhead_pct": float(np.median(ratio) * 100), "overhead_ci95_pct": [lo * 100, hi * 100],
        "per_step_us": float(np.median(diff_us)), "per_step_us_ci95": [dlo, dhi],
        "step_ms_pyhook": float(np.median(py_arr) / 1e6),
        "python_hook_overhead_pct": float(np.median(py_ratio) * 100),
        "python_hook_overhead_ci95_pct": [plo * 100, phi * 100],
        "observer_vs_python_hook_pct": float(np.median(own_ratio) * 100),
        "observer_vs_python_hook_ci95_pct": [olo * 100, ohi * 100],
        "hot_path_us_per_step": hot_ns / 1e3,
        "hot_path_pct_of_step": float(hot_ns / step_ns * 100),
        "chunk_write_ms_cpu": chunk_ns / 1e6, "steps_per_chunk": chunk_steps,
        "chunk_us_per_step": chunk_ns / chunk_steps / 1e3,
        "observer_failures": res["failures"],
    }
    if a.json:
        print(json.dumps(result, indent=2))
        return
    print(f"observer overhead, {a.world} gloo ranks, {len(pairs)} rotated cycles x {a.steps} steps "
          f"({result['steps_measured_per_arm']} steps per arm), {buckets} DDP buckets/step, "
          f"MLP 128->{a.hidden}x{a.layers}->10, batch {a.batch}/rank")
    print(f"  median step without observer : {result['step_ms_without']:.2f} ms")
    print(f"  median step with observer    : {result['step_ms_with']:.2f} ms")
    print(f"  median step, PyTorch's Python allreduce_hook, no observer: {result['step_ms_pyhook']:.2f} ms")
    print(f"  overhead (median over cycles): {result['overhead_pct']:+.2f}%  95% CI [{lo * 100:+.2f}%, "
          f"{hi * 100:+.2f}%]")
    print(f"    of which any Python hook   : {result['python_hook_overhead_pct']:+.2f}%  95% CI "
          f"[{plo * 100:+.2f}%, {phi * 100:+.2f}%]  (PyTorch allreduce_hook vs built-in)")
    print(f"    observer vs Python hook    : {result['observer_vs_python_hook_pct']:+.2f}%  95% CI "
          f"[{olo * 100:+.2f}%, {ohi * 100:+.2f}%]")
    print(f"  per-step difference          : {result['per_step_us']:+.0f} us  "
          f"95% CI [{dlo:+.0f}, {dhi:+.0f}] us")
    print(f"  hot-path CPU cost (direct)   : {result['hot_path_us_per_step']:.1f} us/step "
          f"= {result['hot_path_pct_of_step']:.3f}% of the median step")
    print(f"  chunk writer (thread) CPU    : {result['chunk_write_ms_cpu']:.2f} ms per chunk, one chunk per "
          f"{chunk_steps:.0f} steps = {result['chunk_us_per_step']:.1f} us/step")
    if res["failures"]:
        print(f"  observer failures: {res['failures']}")


if __name__ == "__main__":
    main()
