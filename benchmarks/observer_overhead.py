"""Observer overhead: the same gloo DDP workload with and without the observer, side by side.

    .venv/bin/python benchmarks/observer_overhead.py --pairs 600 --steps 1
    .venv/bin/python benchmarks/observer_overhead.py --world 2 --realistic --pairs 300

One job, DDP replicas of the same model on the same data, one per arm:

* ``without``: DDP's built-in C++ reduction, no observer;
* ``with``: the observer in its default mode (``ddp_instrumentation="auto"``, no pacing: hook-free
  — post-accumulate-grad arrival stamps, DDP's reduction untouched), step records, threaded chunk
  writer, window gathers every 50 steps;
* ``hook``: the observer in comm-hook mode (``ddp_instrumentation="hook"``: a Python comm hook per
  bucket, per-bucket completion times);
* ``pyhook`` (only with ``--pyhook``): PyTorch's own Python ``allreduce_hook``, no observer — the
  price of any Python comm hook on its own;
* ``auto`` (on by default, ``--no-auto-arm`` to drop it): the observer's default mode with
  ``pacing="auto"`` — what issue 6's "on a healthy run, ``auto`` costs ≤ 0.5%" is about. Its pacing
  decisions are printed: trials on a healthy run are part of its cost. A gc trial switches automatic
  garbage collection off *process-wide*, which touches every arm: the cycles it was off are counted
  and printed, never hidden.

Each cycle runs one block of ``--steps`` steps per arm, in an order that rotates through every
permutation of the arms, so drift on this shared machine hits every arm alike. Per cycle the
overhead of an arm is median(step arm) / median(step without) − 1; the figure is the median over
cycles with a 95% percentile-bootstrap CI (resampling cycles). Shown too, each with its own
bootstrap CI: the ratio of the arms' overall median step times, the ratio of their mean step times
(what throughput sees), and the 20%-trimmed mean of the
per-cycle ratios. ``--save`` keeps the per-cycle step times; ``--pool`` analyzes several saved runs
of the same configuration together (more cycles, a narrower CI). The per-step cost in
µs is reported the same way, and measured directly as process CPU time (all threads) of a 1-rank
DDP step with and without the observer, per mode — far less noisy here than wall time.

Step time is rank 0's wall time per step (the all-reduce makes every rank's step the same length).
Each arm runs 1/n_arms of the steps per second a lone job would, so the observers' chunk interval
(``flush_interval_s``, the only time-based interval) is stretched n_arms times: every arm writes a chunk
per as many of its own steps as a real job at the same step time does.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

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
    p.add_argument("--pyhook", action="store_true",
                   help="a fourth arm: PyTorch's Python allreduce_hook without the observer")
    p.add_argument("--steps-only", action="store_true",
                   help="another arm: an observer without the model (step records and windows only, no DDP "
                        "instrumentation), to split the default's cost between step bookkeeping and probe")
    p.add_argument("--auto-arm", action=argparse.BooleanOptionalAction, default=True,
                   help="an arm with the observer's default mode and pacing='auto' (default on)")
    p.add_argument("--cpu-only", action="store_true",
                   help="only the CPU-time measurement (1-rank DDP, per arm, all threads) and the chunk "
                        "cost: robust to load, ~1-2 minutes")
    p.add_argument("--cpu-reps", type=int, default=30,
                   help="interleaved blocks per arm for the CPU measurement (default 30)")
    p.add_argument("--save", default="", help="also save the per-cycle step times (JSON) to this file")
    p.add_argument("--pool", nargs="+", default=[], metavar="FILE",
                   help="analyze the cycles of runs saved with --save (same configuration) together")
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
    import itertools

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from fabricpace.observe import ObserverConfig, observe

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(a.seed + rank)
    x = torch.randn(a.batch, 128, generator=gen)
    y = torch.randint(0, 10, (a.batch,), generator=gen)
    base = Path(a.out).parent

    def replica() -> DDP:
        return DDP(_model(a.hidden, a.layers), bucket_cap_mb=a.bucket_mb)

    def plain_step(model: DDP):  # type: ignore[no-untyped-def]
        def step() -> None:
            model.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()

        return step

    def observed_step(model: DDP, obs):  # type: ignore[no-untyped-def]
        def step() -> None:
            with obs.step(samples=a.batch):
                model.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(x), y).backward()

        return step

    arms = {"without": plain_step(replica())}
    observers = {}
    # The arms share the wall clock, so each runs 1/n_arms of the steps a lone job would run per
    # second. The observer's one time-based interval (a chunk every flush_interval_s) is stretched by
    # that factor, so every arm writes a chunk per as many of its own steps as a real job does;
    # everything else the observer does is counted in steps already.
    n_arms = 3 + int(a.auto_arm) + int(a.steps_only) + int(a.pyhook)
    flush_s = ObserverConfig().flush_interval_s * n_arms
    for arm, mode in (("with", "auto"), ("hook", "hook")):
        model = replica()
        cfg = ObserverConfig(status_line=False, ddp_instrumentation=mode, flush_interval_s=flush_s)
        observers[arm] = observe(model, run_dir=base / f"run-{arm}", window=a.window, config=cfg)
        arms[arm] = observed_step(model, observers[arm])
    pacers = {}
    if a.auto_arm:
        model = replica()
        observers["auto"] = observe(model, run_dir=base / "run-auto", window=a.window, pacing="auto",
                                    config=ObserverConfig(status_line=False, flush_interval_s=flush_s))
        pacers["auto"] = observers["auto"].pacer.pacer  # kept: close() drops it from the observer
        arms["auto"] = observed_step(model, observers["auto"])
    if a.steps_only:
        cfg = ObserverConfig(status_line=False, flush_interval_s=flush_s)
        observers["steps"] = observe(None, run_dir=base / "run-steps", window=a.window, config=cfg)
        arms["steps"] = observed_step(replica(), observers["steps"])
    if a.pyhook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model = replica()
        model.register_comm_hook(None, default_hooks.allreduce_hook)
        arms["pyhook"] = plain_step(model)
    for _ in range(a.warmup):
        for fn in arms.values():
            fn()
    # Each cycle runs every arm once, in an order rotating through all permutations (a balanced
    # design over cycles), so slow drift on this shared machine hits every arm alike.
    orders = list(itertools.permutations(sorted(arms)))
    blocks: list[dict[str, object]] = []
    gc_off_cycles: list[int] = []  # cycles run with automatic gc off (a gc trial of the auto arm)
    cpu0 = _thread_cpu(observers)
    for cycle in range(a.pairs):
        if not gc.isenabled():
            gc_off_cycles.append(cycle)
        for arm in orders[cycle % len(orders)]:
            fn = arms[arm]
            times = []
            for _ in range(a.steps):
                t0 = time.perf_counter_ns()
                fn()
                times.append(time.perf_counter_ns() - t0)
            blocks.append({"arm": arm, "cycle": cycle, "step_ns": times})
    cpu1 = _thread_cpu(observers)
    steps_run = a.pairs * a.steps
    threads = {name: {"cpu_us_per_step": (cpu1[name][0] - cpu0[name][0]) / 1e3 / steps_run,
                      "wakeups_per_step": (cpu1[name][1] - cpu0[name][1]) / steps_run}
               for name in cpu1 if name in cpu0}
    pacing = _pacing_summary(pacers.get("auto"), observers.get("auto"), gc_off_cycles)
    for obs in observers.values():
        obs.close()
    if rank == 0:
        Path(a.out).write_text(json.dumps({
            "blocks": blocks, "failures": {k: o.failures for k, o in observers.items()},
            "modes": {k: o.ddp_mode for k, o in observers.items()},
            "buckets": len(_buckets(base / "run-hook")), "threads": threads, "pacing": pacing,
        }))
    dist.destroy_process_group()


def _thread_cpu(observers: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(CPU ns, context switches) so far of each observer background thread, from /proc (Linux)."""
    import threading

    out: dict[str, tuple[int, int]] = {}
    for t in threading.enumerate():
        if not t.name.startswith("fabricpace") or t.native_id is None:
            continue
        try:
            task = Path(f"/proc/self/task/{t.native_id}")
            ns = int((task / "schedstat").read_text().split()[0])
            status = (task / "status").read_text()
            switches = sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line)
        except (OSError, ValueError, IndexError):
            continue
        key = f"{t.name}#{t.native_id}"
        out[key] = (ns, switches)
    return out


def _pacing_summary(pacer: Any, obs: Any, gc_off_cycles: list[int]) -> dict[str, Any] | None:
    """What the auto arm's pacer did: its decisions, gc collections it ran, and the cycles that ran
    with automatic gc off (process-wide: every arm ran those cycles without automatic gc)."""
    if pacer is None:
        return None
    decisions = [{"step": d.step, "rank": d.rank, "policy": d.policy, "action": d.action, "value": d.value,
                  "reason": d.reason} for d in getattr(pacer, "decisions", [])]
    gc_act = getattr(pacer, "gc", None)
    return {
        "decisions": decisions,
        "gc_trials": sum(1 for d in decisions if d["policy"] == "gc" and d["action"] in ("enable", "adjust")),
        "gc_collections": getattr(gc_act, "collections", 0),
        "gc_full_collections": getattr(gc_act, "full_collections", 0),
        "gc_off_cycles": len(gc_off_cycles),
        "gc_off_first_last": [gc_off_cycles[0], gc_off_cycles[-1]] if gc_off_cycles else [],
        "comm_hook_after_step": getattr(obs, "comm_hook_step", None),
        "status": pacer.status() if hasattr(pacer, "status") else "",
    }


def _buckets(run_dir: Path) -> list[int]:
    """Sequence numbers of the last recorded step's buckets (how many buckets a step has)."""
    try:
        import polars as pl

        c = pl.read_parquet(sorted((run_dir / "collectives" / "rank-00000").glob("part-*.parquet"))[-1])
        return c.filter(pl.col("step") == c["step"].max())["seq"].to_list()
    except Exception:  # a benchmark detail; fall back to one bucket
        return []


def hot_path_cost_ns(buckets: int, *, steps: int = 200, reps: int = 15) -> dict[str, float]:
    """CPU time per step that the observer adds, ns, per mode: a real 1-rank gloo DDP step (tiny
    model, ``buckets`` buckets) with the observer in each mode vs without, as process CPU time of
    all threads (hooks, callbacks, step records, amortized finalization, window summaries and
    gathers, chunk hand-off; chunk encoding is measured separately), best of ``reps`` blocks each."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from fabricpace.observe import ObserverConfig, observe

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    width = 32
    layer_mb = (width * width + width) * 4 / 2**20

    def replica() -> DDP:
        torch.manual_seed(0)
        layers = [torch.nn.Linear(width, width) for _ in range(buckets)]
        # One bucket per layer: the cap sits just above one layer's gradient bytes.
        return DDP(torch.nn.Sequential(*layers), bucket_cap_mb=layer_mb * 1.01)

    x = torch.randn(4, width)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        models = {"without": replica()}
        observers = {}
        for arm, mode in (("with", "auto"), ("hook", "hook"), ("auto", "auto"), ("steps", "auto")):
            models[arm] = replica()
            observers[arm] = observe(None if arm == "steps" else models[arm], Path(tmp) / arm,
                                     pacing="auto" if arm == "auto" else "off",
                                     config=ObserverConfig(status_line=False, ddp_instrumentation=mode))

        def block(arm: str) -> int:
            model, obs = models[arm], observers.get(arm)
            t0 = time.process_time_ns()
            for _ in range(steps):
                if obs is None:
                    model.zero_grad(set_to_none=True)
                    model(x).sum().backward()
                else:
                    with obs.step(samples=4):
                        model.zero_grad(set_to_none=True)
                        model(x).sum().backward()
            return time.process_time_ns() - t0

        for arm in models:
            block(arm)  # warm-up: bucket rebuild, learning, first chunk
        times: dict[str, list[int]] = {arm: [] for arm in models}
        for _ in range(reps):  # interleaved, so a burst of load on this shared machine hits every arm
            for arm in models:
                times[arm].append(block(arm))
        best = {arm: min(v) for arm, v in times.items()}
        base = np.asarray(times["without"], dtype=np.float64)
        for arm, obs in observers.items():
            out[arm] = (best[arm] - best["without"]) / steps
            # Also the median of the per-rep paired differences (blocks run back to back).
            out[f"{arm}_paired"] = float(np.median(np.asarray(times[arm], dtype=np.float64) - base)) / steps
            out[f"{arm}_mode"] = obs.ddp_mode  # type: ignore[assignment]
            obs.close()
        out["step_ns"] = best["without"] / steps
    dist.destroy_process_group()
    return out


def chunk_cost_ns(steps: int, buckets: int, n: int = 20) -> float:
    """CPU time to build and atomically write one chunk (steps + collectives parts) as the observer's
    writer thread does in the default mode (bucket rows expanded from the probe's round block), ns."""
    from fabricpace.observe._guard import Guard
    from fabricpace.observe.chunks import ChunkSink
    from fabricpace.observe.recorder import RoundsBlock

    t = np.arange(steps, dtype=np.int64) * 1_000_000
    rows = np.zeros((steps, 11), dtype=np.int64)
    rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 9] = np.arange(steps), t, t + 900_000, 8
    enter = t[:, None] + 500_000 + 10_000 * np.arange(buckets)[None, :]
    block = RoundsBlock(rows[:, 0].copy(), 0, enter, t + 800_000, tuple([1000] * buckets), 0, 1,
                        ("ddp:world", "all_reduce"))
    chunk = {"steps": rows, "collectives": [block], "ops": []}
    with tempfile.TemporaryDirectory() as tmp:
        sink = ChunkSink(Path(tmp), 0, Guard(0), threaded=False)
        sink.submit(chunk, 0)  # warm-up (imports, first file)
        t0 = time.process_time_ns()
        for _ in range(n):
            sink.submit(chunk, 0)
        return (time.process_time_ns() - t0) / n


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bootstrap(values: np.ndarray, rng: np.random.Generator, n: int = 5000) -> tuple[float, float]:
    idx = rng.integers(0, values.size, size=(n, values.size))
    meds = np.median(values[idx], axis=1)
    return float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def _trimmed_mean(values: np.ndarray, cut: float = 0.2, axis: int = -1) -> np.ndarray:
    """Mean of the middle (1 − 2·cut) of the values: robust to this machine's outlier steps, and less
    noisy than the median when the bulk is roughly symmetric."""
    v = np.sort(values, axis=axis)
    n = v.shape[axis]
    k = int(n * cut)
    return np.asarray(np.take(v, range(k, n - k), axis=axis).mean(axis=axis))


def _trimmed_ci(values: np.ndarray, rng: np.random.Generator, n: int = 2000) -> tuple[float, float]:
    idx = rng.integers(0, values.size, size=(n, values.size))
    t = _trimmed_mean(values[idx], axis=1)
    return float(np.percentile(t, 2.5)), float(np.percentile(t, 97.5))


def _ratio_ci(num: np.ndarray, den: np.ndarray, rng: np.random.Generator, stat: Any = np.median,
              n: int = 5000) -> tuple[float, float]:
    """95% bootstrap CI of stat(num) / stat(den) - 1, resampling cycles (pairs stay together)."""
    idx = rng.integers(0, num.size, size=(n, num.size))
    r = stat(num[idx], axis=1) / stat(den[idx], axis=1) - 1.0
    return float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))


LABELS = {"with": "observer, default (hook-free)", "hook": "observer, comm-hook mode",
          "auto": "observer, default mode, pacing='auto'",
          "pyhook": "PyTorch allreduce_hook, no observer", "steps": "observer without the model: steps only"}


def main() -> None:
    a = _args()
    if a.worker:
        worker(a)
        # Results are written and flushed. Skip interpreter teardown: torch's C++ static destructors can
        # abort ("terminate called without an active exception") while a gloo thread winds down,
        # which would turn a finished rank into a failed one (same as fabricpace.lab.worker).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    t_start = time.time()
    load_before = _loadavg()
    if a.cpu_only:
        _cpu_only(a, t_start, load_before)
        return
    if a.pool:
        step, res, load_before, load_after = _pooled(a)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "result.json"
            port = _free_port()
            argv = [a for a in sys.argv[1:] if a != "--json"]
            procs = []
            for rank in range(a.world):
                env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(a.world), MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
                procs.append(subprocess.Popen(
                    [sys.executable, __file__, *argv, "--worker", "--out", str(out)], env=env))
            codes = [p.wait() for p in procs]
            if any(codes):
                raise SystemExit(f"a worker failed: exit codes {codes}")
            res = json.loads(out.read_text())
        load_after = _loadavg()
        blocks = res.pop("blocks")
        cycles = sorted({b["cycle"] for b in blocks})
        med = {(b["cycle"], b["arm"]): float(np.median(b["step_ns"])) for b in blocks}
        step = {arm: np.array([med[(c, arm)] for c in cycles]) for arm in sorted({b["arm"] for b in blocks})}
        if a.save:
            Path(a.save).write_text(json.dumps({
                "config": _config(a), "step_ns": {k: v.tolist() for k, v in step.items()},
                "loadavg": [load_before, load_after], **res}))
    arms = sorted(step)
    cycles = list(range(len(step["without"])))
    wo = step["without"]
    rng = np.random.default_rng(0)
    buckets = max(int(res["buckets"]), 1)
    result: dict[str, object] = {
        "world": a.world, "hidden": a.hidden, "layers": a.layers, "batch": a.batch,
        "pairs": len(cycles), "steps_per_block": a.steps, "steps_measured_per_arm": len(cycles) * a.steps,
        "buckets_per_step": buckets, "step_ms": {arm: float(np.median(v) / 1e6) for arm, v in step.items()},
        "modes": res["modes"], "observer_failures": res["failures"],
        "loadavg_before": load_before, "loadavg_after": load_after,
    }
    vs: dict[str, dict[str, object]] = {}
    comparisons = [(arm, "without") for arm in ("with", "auto", "hook", "steps", "pyhook") if arm in step]
    comparisons.append(("with", "hook"))
    if "auto" in step:
        comparisons.append(("auto", "with"))
    for num, den in comparisons:
        ratio = step[num] / step[den] - 1.0
        diff_us = (step[num] - step[den]) / 1e3
        lo, hi = _bootstrap(ratio, rng)
        dlo, dhi = _bootstrap(diff_us, rng)
        rlo, rhi = _ratio_ci(step[num], step[den], rng)
        mlo, mhi = _ratio_ci(step[num], step[den], rng, np.mean)
        vs[f"{num}_vs_{den}"] = {
            "overhead_pct": float(np.median(ratio) * 100), "overhead_ci95_pct": [lo * 100, hi * 100],
            "ratio_of_medians_pct": float((np.median(step[num]) / np.median(step[den]) - 1) * 100),
            "ratio_of_medians_ci95_pct": [rlo * 100, rhi * 100],
            # What throughput sees; unlike a mean of per-cycle ratios it has no upward bias from a
            # noisy denominator.
            "ratio_of_means_pct": float((np.mean(step[num]) / np.mean(step[den]) - 1) * 100),
            "ratio_of_means_ci95_pct": [mlo * 100, mhi * 100],
            "per_step_us": float(np.median(diff_us)), "per_step_us_ci95": [dlo, dhi],
            "trimmed_mean_pct": float(_trimmed_mean(ratio) * 100),
            "trimmed_mean_ci95_pct": [100 * x for x in _trimmed_ci(ratio, rng)],
        }
    result["comparisons"] = vs
    hot = hot_path_cost_ns(buckets)
    from fabricpace.observe import ObserverConfig

    defaults = ObserverConfig()
    step_ns = float(np.median(wo))
    # One chunk per max(flush_every steps, flush_interval_s) (ObserverConfig defaults).
    chunk_steps = max(float(defaults.flush_every), defaults.flush_interval_s * 1e9 / step_ns)
    chunk_ns = chunk_cost_ns(int(chunk_steps), buckets)
    hot_arms = ("with", "hook", "auto")
    result.update({
        "cpu_us_per_step": {arm: hot[arm] / 1e3 for arm in hot_arms},
        "cpu_us_per_step_modes": {arm: hot[f"{arm}_mode"] for arm in hot_arms},
        "cpu_pct_of_step": {arm: hot[arm] / step_ns * 100 for arm in hot_arms},
        "threads_4rank_rank0": res.get("threads", {}), "pacing_auto": res.get("pacing"),
        "cpu_probe_step_us": hot["step_ns"] / 1e3,
        "chunk_write_ms_cpu": chunk_ns / 1e6, "steps_per_chunk": chunk_steps,
        "chunk_us_per_step": chunk_ns / chunk_steps / 1e3,
        "seconds": time.time() - t_start,
    })
    if a.json:
        print(json.dumps(result, indent=2))
        return
    print(f"observer overhead, {a.world} gloo ranks, {len(cycles)} rotated cycles x {a.steps} steps "
          f"({result['steps_measured_per_arm']} steps per arm), {buckets} DDP buckets/step, "
          f"MLP 128->{a.hidden}x{a.layers}->10, batch {a.batch}/rank")
    print(f"  load average before / after : {load_before} / {load_after}   ({result['seconds']:.0f} s)")
    print(f"  observer modes              : {res['modes']}")
    for arm in arms:
        label = "no observer, DDP built-in" if arm == "without" else LABELS[arm]
        print(f"  median step {arm:<8}: {np.median(step[arm]) / 1e6:8.2f} ms   ({label})")
    for key, v in vs.items():
        lo, hi = v["overhead_ci95_pct"]  # type: ignore[misc]
        rlo, rhi = v["ratio_of_medians_ci95_pct"]  # type: ignore[misc]
        dlo, dhi = v["per_step_us_ci95"]  # type: ignore[misc]
        tlo, thi = cast(list[float], v["trimmed_mean_ci95_pct"])
        mlo, mhi = cast(list[float], v["ratio_of_means_ci95_pct"])
        print(f"  {key:<16}: {v['overhead_pct']:+.2f}% 95% CI [{lo:+.2f}, {hi:+.2f}]  | ratio of medians "
              f"{v['ratio_of_medians_pct']:+.2f}% [{rlo:+.2f}, {rhi:+.2f}]  | ratio of means "
              f"{v['ratio_of_means_pct']:+.2f}% [{mlo:+.2f}, {mhi:+.2f}]  | 20%-trimmed mean "
              f"{v['trimmed_mean_pct']:+.2f}% [{tlo:+.2f}, {thi:+.2f}]  | {v['per_step_us']:+.0f} us "
              f"[{dlo:+.0f}, {dhi:+.0f}]")
    for arm in hot_arms:
        us, pct = hot[arm] / 1e3, hot[arm] / step_ns * 100
        print(f"  CPU per step, {arm:<4} ({hot[arm + '_mode']}): {us:6.1f} us = {pct:.3f}% "
              f"of the median step (1-rank DDP, {buckets} buckets, step {hot['step_ns'] / 1e3:.0f} us CPU)")
    print(f"  chunk writer (thread) CPU    : {result['chunk_write_ms_cpu']:.2f} ms per chunk, one chunk per "
          f"{chunk_steps:.0f} steps = {result['chunk_us_per_step']:.1f} us/step")
    for name, v in sorted(res.get("threads", {}).items()):
        print(f"  rank 0 thread {name:<28}: {v['cpu_us_per_step']:6.2f} us CPU and "
              f"{v['wakeups_per_step']:.3f} context switches per measured step (all arms' steps)")
    _print_pacing(res.get("pacing"))
    if any(res["failures"].values()):
        print(f"  observer failures: {res['failures']}")


def _cpu_only(a: argparse.Namespace, t_start: float, load_before: str) -> None:
    """``--cpu-only``: CPU per step per arm (all threads of the process), and the writer's chunk cost."""
    from fabricpace.observe import ObserverConfig

    buckets = 4
    hot = hot_path_cost_ns(buckets, reps=a.cpu_reps)
    defaults = ObserverConfig()
    print(f"observer CPU per step, 1-rank gloo DDP ({buckets} buckets, tiny model: step "
          f"{hot['step_ns'] / 1e3:.0f} us CPU), {a.cpu_reps} interleaved blocks of 200 steps per arm, "
          f"process CPU time (all threads); load average {load_before} / {_loadavg()}")
    for arm in ("with", "steps", "auto", "hook"):
        print(f"  {arm:<5} ({hot[arm + '_mode'] or 'no model'}): best-of minus best-of "
              f"{hot[arm] / 1e3:6.1f} us | median of paired block differences "
              f"{hot[arm + '_paired'] / 1e3:6.1f} us")
    for step_ms in (25.0, 100.0):
        chunk_steps = max(float(defaults.flush_every), defaults.flush_interval_s * 1e3 / step_ms)
        ns = chunk_cost_ns(int(chunk_steps), buckets)
        print(f"  chunk writer thread at {step_ms:.0f} ms steps: {ns / 1e6:.2f} ms CPU per chunk of "
              f"{chunk_steps:.0f} steps (one per {defaults.flush_interval_s:.0f} s) = "
              f"{ns / chunk_steps / 1e3:.1f} us/step")
    print(f"  ({time.time() - t_start:.0f} s)")


def _print_pacing(pacing: Any) -> None:
    if not pacing:
        return
    runs = pacing if isinstance(pacing, list) else [pacing]
    for i, p in enumerate(runs):
        tag = f" (run {i + 1})" if len(runs) > 1 else ""
        print(f"  auto arm pacing{tag}: {len(p['decisions'])} decisions, {p['gc_trials']} gc trials, "
              f"{p['gc_collections']} lockstep gc collections ({p['gc_full_collections']} full); "
              f"automatic gc was OFF process-wide in {p['gc_off_cycles']} cycles"
              + (f" (cycles {p['gc_off_first_last'][0]}..{p['gc_off_first_last'][1]}: every arm ran them "
                 "without automatic gc)" if p["gc_off_cycles"] else "")
              + (f"; comm hook installed after step {p['comm_hook_after_step']}"
                 if p["comm_hook_after_step"] is not None else "; no comm hook installed"))
        for d in p["decisions"]:
            print(f"    step {d['step']:>6} rank {d['rank']:>2} {d['policy']:<9} {d['action']:<7} "
                  f"value {d['value']:<10.4g} {d['reason']}")
        if p.get("status"):
            print(f"    final status: {p['status']}")


def _config(a: argparse.Namespace) -> dict[str, object]:
    return {k: getattr(a, k) for k in ("world", "hidden", "layers", "batch", "bucket_mb", "steps", "window")}


def _pooled(a: argparse.Namespace) -> tuple[dict[str, np.ndarray], dict[str, Any], str, str]:
    """Cycles of several saved runs of the same configuration, concatenated (``--pool``)."""
    runs = [json.loads(Path(f).read_text()) for f in a.pool]
    if any(r["config"] != _config(a) for r in runs):
        raise SystemExit(f"--pool: saved runs differ from this configuration {_config(a)}: "
                         f"{[r['config'] for r in runs]}")
    arms = sorted(runs[0]["step_ns"])
    step = {arm: np.concatenate([np.asarray(r["step_ns"][arm]) for r in runs]) for arm in arms}
    meta = {"buckets": runs[0]["buckets"], "modes": runs[0]["modes"],
            "failures": {k: v for r in runs for k, v in r["failures"].items() if v} or runs[0]["failures"],
            "pacing": [r["pacing"] for r in runs if r.get("pacing")]}
    loads = "; ".join(f"{r['loadavg'][0]} / {r['loadavg'][1]}" for r in runs)
    return step, meta, loads, f"({len(runs)} runs pooled)"


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
