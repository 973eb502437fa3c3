"""Pacing on real gloo ranks: interleaved A/B runs with bootstrap CIs (not a pass/fail test).

    .venv/bin/python benchmarks/pacing_real.py                # all scenarios
    .venv/bin/python benchmarks/pacing_real.py --scenario gc --pairs 4 --steps 240

Each scenario runs pairs of complete multi-process trainings, A (pacing off) and B (pacing on), in
ABBA order so a drift of the shared machine hits both arms alike, and prints the throughput ratio B/A
and the CV change with a bootstrap CI over pairs, plus whether the parameters after N steps match.

Scenarios (4 ranks, a small MLP under DDP on gloo, the same global batch every step):
- ``gc``: Python-object churn with cyclic garbage and a large live heap: automatic collections hit
  ranks at different steps, and the all-reduce makes every rank wait for each pause.
- ``slow``: rank 1 does extra compute per sample (its slowness scales with its work, so moving
  samples away from it helps; a fixed sleep per step could not be rebalanced away).
- ``healthy``: nothing wrong: pacing ``auto`` must cost (almost) nothing.

The worker is also used by tests/pacing (small sizes), so the workload here is the one tested there.
Until the observer (fabricpace.observe) drives the pacer, the worker measures steps, arrivals and
window summaries itself and calls the pacer's hooks exactly as CONTRACTS.md says the observer does.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve()

# ----------------------------------------------------------------------------------------- worker


def _rss_bytes() -> float:
    try:
        with open("/proc/self/statm") as f:
            return float(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0.0


class _GcMeter:
    """GC pause time and count through gc.callbacks (what the observer does)."""

    def __init__(self) -> None:
        self.ns = 0
        self.count = 0
        self._t0 = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter_ns()
        else:
            self.ns += time.perf_counter_ns() - self._t0
            self.count += 1

    def take(self) -> tuple[int, int]:
        ns, n = self.ns, self.count
        self.ns = self.count = 0
        return ns, n


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from fabricpace.pacing import PacingConfig, make_pacer, sample_weight
    from fabricpace.run.window import WindowSummary

    rank, world = args.rank, args.world
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    d_in, hidden = 64, args.hidden
    model = nn.Sequential(
        nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)
    )
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1234)
    n_data = args.global_batch * 16
    data_x = torch.randn(n_data, d_in, generator=gen)
    data_y = torch.randint(0, 10, (n_data,), generator=gen)
    heavy = torch.randn(d_in, 1024, generator=gen)

    cfg = PacingConfig(**json.loads(args.config)) if args.config else PacingConfig()
    if args.driver == "observer":
        _observer_loop(args, ddp, opt, data_x, data_y, heavy, cfg)
        return
    pacer = None
    if args.pacing != "off":
        pacer = make_pacer(
            args.pacing, rank=rank, world_size=world, run_dir=args.run_dir, window=args.window, config=cfg
        )
        if args.pin:  # a fixed state from step 0 (actuator tests and steady-state comparisons)
            from fabricpace.pacing import PacingState

            pin = json.loads(args.pin)
            pin = {k: tuple(v) if isinstance(v, list) else v for k, v in pin.items()}
            budget_base = float(pin.pop("step_time_ns", 0) or 0)
            pacer.pin(PacingState(**pin), step_time_ns=budget_base)

    # Per-step bucket arrival/completion times on this rank (perf_counter is CLOCK_MONOTONIC, shared
    # by all processes of one machine, so arrivals compare directly).
    enters: dict[int, int] = {}
    exits: dict[int, int] = {}

    def hook(state, bucket):  # no annotations: DDP checks them against its own types
        idx = bucket.index()
        if pacer is not None:
            pacer.before_bucket(idx)
        enters[idx] = time.perf_counter_ns()
        buf = bucket.buffer()
        fut = dist.all_reduce(buf, async_op=True).get_future()

        def done(f: Any) -> Any:
            exits[idx] = time.perf_counter_ns()
            if pacer is not None:
                pacer.after_bucket(idx)
            return f.value()[0].div_(world)

        return fut.then(done)

    ddp.register_comm_hook(None, hook)
    meter = _GcMeter()
    gc.callbacks.append(meter)

    # GC churn: a large live heap makes full collections slow; cyclic garbage that survives a few
    # steps gets promoted and triggers them at steps that differ per rank.
    rng = random.Random(1000 + rank)
    live_heap = [{"i": i, "l": [i]} for i in range(args.heap)] if args.churn else []  # noqa: F841
    recent: collections.deque[list[Any]] = collections.deque(maxlen=max(args.survive, 1))

    rows: list[tuple[int, ...]] = []  # per step: t0, t1, compute, wait, gc_ns, gc_n, paced, samples
    arr_rows: list[list[int]] = []  # per step: enter/exit per bucket
    summaries_log: list[list[float]] = []
    dist.barrier()
    t_run0 = time.perf_counter_ns()
    w, first, next_close = -1, 0, args.window  # window index, its first step, the step that closes it
    for step in range(args.steps):
        t0 = time.perf_counter_ns()
        if pacer is not None:
            pacer.on_step_start(step)
        counts = pacer.batch_counts(args.global_batch) if pacer is not None else None
        if counts is None:
            base = args.global_batch // world
            counts = [base + (1 if r < args.global_batch % world else 0) for r in range(world)]
        off = sum(counts[:rank])
        n = counts[rank]
        start = (step * args.global_batch + off) % n_data
        idx = torch.arange(start, start + n) % n_data
        x, y = data_x[idx], data_y[idx]
        if args.churn:  # the step's temporaries: dead by the end of the step unless --survive
            objs = _churn(rng, args.churn)
            if args.survive:
                recent.append(objs)
            del objs
        if rank == args.slow_rank:
            _slow_work(args, x, heavy, n)
        enters.clear()
        exits.clear()
        loss = nn.functional.cross_entropy(ddp(x), y) * sample_weight(n, args.global_batch, world)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        paced = pacer.on_step_end(step) if pacer is not None else 0
        t1 = time.perf_counter_ns()
        gc_ns, gc_n = meter.take()
        nb = 16  # fixed width so windows stack; DDP rebuilds its buckets after the first step
        last_enter = max(enters.values()) if enters else t1
        compute = last_enter - t0
        wait = t1 - last_enter
        rows.append((t0, t1, compute, wait, gc_ns, gc_n, paced, n))
        arr_rows.append([enters.get(i, 0) for i in range(nb)] + [exits.get(i, 0) for i in range(nb)])

        if step + 1 >= next_close:
            # Windows as the observer closes them: every `window` steps, or earlier when the pacer asks
            # for a short one (a rebalance trial's probe, counted from the step its shares apply).
            length = step + 1 - first
            w, first = w + 1, step + 1
            seg = np.asarray(rows[-length:], dtype=np.float64)
            arr = torch.tensor(np.asarray(arr_rows[-length:], dtype=np.int64))
            gathered = [torch.zeros_like(arr) for _ in range(world)]
            dist.all_gather(gathered, arr)
            g = np.stack([t.numpy() for t in gathered])  # rank x step x (2*nb)
            nbk = g.shape[2] // 2
            ent, ext = g[:, :, :nbk], g[:, :, nbk:]
            valid = (ent > 0).all(axis=0) & (ext > 0).all(axis=0)  # step x bucket seen on every rank
            last_r = np.where(valid, np.argmax(ent, axis=0), -1)
            transfer = np.where(valid, (ext.min(axis=0) - ent.max(axis=0)).clip(min=0), 0).sum(axis=1)
            dur = seg[:, 1] - seg[:, 0]
            comp = float(np.median(seg[:, 2]))
            summ = WindowSummary(
                rank=rank,
                window=w,
                first_step=step + 1 - length,
                steps=length,
                step_mean_ns=float(dur.mean()),
                step_median_ns=float(np.median(dur)),
                step_std_ns=float(dur.std()),
                compute_median_ns=comp,
                compute_per_sample_ns=comp / max(float(np.median(seg[:, 7])), 1.0),
                wait_mean_ns=float(seg[:, 3].mean()),
                comm_mean_ns=float(seg[:, 3].mean()),
                transfer_mean_ns=float(transfer.mean()),
                last_arrivals=float((last_r == rank).sum()),
                collectives=float(valid.sum()),
                data_mean_ns=0.0,
                gc_mean_ns=float(seg[:, 4].mean()),
                gc_count=float(seg[:, 5].sum()),
                paced_mean_ns=float(seg[:, 6].mean()),
                samples_mean=float(seg[:, 7].mean()),
                rss_bytes=_rss_bytes(),
            )
            vec = torch.tensor(summ.to_array())
            allv = [torch.zeros_like(vec) for _ in range(world)]
            dist.all_gather(allv, vec)
            summaries = [WindowSummary.from_array(v.numpy()) for v in allv]
            if rank == 0:
                summaries_log.extend(s.to_array().tolist() for s in summaries)
            next_close = step + 1 + args.window
            if pacer is not None:
                pacer.on_window(step, summaries)
                end = getattr(pacer, "next_window_end", None)
                if end is not None and end < next_close:
                    next_close = max(step + 2, int(end))
    dist.barrier()
    t_run1 = time.perf_counter_ns()
    if pacer is not None:
        pacer.close()
    gc.callbacks.remove(meter)
    if rank == 0:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        out = {
            "wall_s": (t_run1 - t_run0) / 1e9,
            "rows": rows,
            "params": flat.numpy().view(np.int32).tolist() if args.dump_params else None,
            "params_f": flat.tolist() if args.dump_params else None,
            "decisions": [vars(d) for d in pacer.decisions] if pacer is not None else [],
            "status": pacer.status() if pacer is not None else "off",
            "max_in_flight": pacer.comm.max_in_flight_seen if pacer is not None else None,
            "gc_lockstep_collections": pacer.gc.collections if pacer is not None else 0,
            "controller_s": pacer.controller_s if pacer is not None else 0.0,
            "summaries": summaries_log,
        }
        _write_record(args.out, json.dumps(out))
    dist.destroy_process_group()


def _write_record(path: str, text: str) -> None:
    """Write rank 0's record atomically: the launcher trusts a record that exists."""
    tmp = Path(path + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _slow_work(args: argparse.Namespace, x: Any, heavy: Any, n: int) -> None:
    """The slow rank's extra time, proportional to its samples (so moving samples away helps).

    ``--slow-ms-per-sample``: the rank's device is slower per sample (a sleep, so it does not take CPU
    from the other ranks on this shared 2-core machine, as a slower GPU would not); ``--slow-factor``:
    extra CPU compute per sample (on an oversubscribed CPU this competes with the other ranks).
    """
    import torch

    if args.slow_ms_per_sample > 0:
        time.sleep(args.slow_ms_per_sample * n / 1e3)
    if args.slow_factor > 0:
        with torch.no_grad():
            for _ in range(args.slow_factor):
                torch.tanh(x @ heavy).sum()


def _churn(rng: random.Random, n: int) -> list[Any]:
    objs = []
    for _ in range(rng.randint(n // 2, n * 3 // 2)):
        a: dict[str, Any] = {}
        b = {"a": a}
        a["b"] = b
        objs.append(a)
    return objs


def _observer_loop(
    args: argparse.Namespace, ddp: Any, opt: Any, data_x: Any, data_y: Any, heavy: Any, cfg: Any
) -> None:
    """The same training through ``fabricpace.observe(..., pacing=...)``: the observer measures, gathers
    the window summaries and drives the pacer (CONTRACTS.md), as in a user's job."""
    import torch
    import torch.distributed as dist
    from torch import nn

    import fabricpace
    from fabricpace.pacing import make_pacer, sample_weight
    from fabricpace.pacing.sampler import find_batch_counts

    rank, world = args.rank, args.world
    pacing: Any = "off"
    if args.pacing != "off":
        pacing = make_pacer(
            args.pacing, rank=rank, world_size=world, run_dir=args.run_dir, window=args.window, config=cfg
        )
    rng = random.Random(1000 + rank)
    live_heap = [{"i": i, "l": [i]} for i in range(args.heap)] if args.churn else []  # noqa: F841
    n_data = data_x.shape[0]
    rows: list[tuple[int, ...]] = []
    meter = _GcMeter()
    gc.callbacks.append(meter)
    run_dir = Path(args.run_dir) / f"obs-{args.pacing}"
    dist.barrier()
    t_run0 = time.perf_counter_ns()
    with fabricpace.observe(ddp, run_dir=str(run_dir), pacing=pacing, window=args.window) as obs:
        for step in range(args.steps):
            t0 = time.perf_counter_ns()
            fn = find_batch_counts(obs)
            counts = fn(args.global_batch) if fn is not None else None
            if counts is None:
                base = args.global_batch // world
                counts = [base + (1 if r < args.global_batch % world else 0) for r in range(world)]
            n = counts[rank]
            start = (step * args.global_batch + sum(counts[:rank])) % n_data
            idx = torch.arange(start, start + n) % n_data
            with obs.step(samples=n):
                x, y = data_x[idx], data_y[idx]
                if args.churn:
                    objs = _churn(rng, args.churn)
                    del objs
                if rank == args.slow_rank:
                    _slow_work(args, x, heavy, n)
                loss = nn.functional.cross_entropy(ddp(x), y) * sample_weight(n, args.global_batch, world)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            t1 = time.perf_counter_ns()
            gc_ns, gc_n = meter.take()
            rows.append((t0, t1, 0, 0, gc_ns, gc_n, 0, n))
        pacer = getattr(getattr(obs, "pacer", None), "pacer", None)
        status = pacer.status() if pacer is not None else "off"
        decisions = [vars(d) for d in pacer.decisions] if pacer is not None else []
    dist.barrier()
    t_run1 = time.perf_counter_ns()
    gc.callbacks.remove(meter)
    if rank == 0:
        flat = torch.cat([p.detach().reshape(-1) for p in ddp.module.parameters()])
        _write_record(args.out,
            json.dumps(
                {
                    "wall_s": (t_run1 - t_run0) / 1e9,
                    "rows": rows,
                    "params": flat.numpy().view(np.int32).tolist() if args.dump_params else None,
                    "params_f": flat.tolist() if args.dump_params else None,
                    "decisions": decisions,
                    "status": status,
                    "run_dir": str(run_dir),
                }
            )
        )
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------------ launch


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_training(
    *,
    pacing: str,
    world: int = 4,
    steps: int = 200,
    window: int = 20,
    global_batch: int = 64,
    hidden: int = 256,
    churn: int = 0,
    heap: int = 0,
    survive: int = 0,
    slow_rank: int = -1,
    slow_factor: int = 0,
    slow_ms_per_sample: float = 0.0,
    bucket_mb: float = 0.05,
    config: dict[str, Any] | None = None,
    dump_params: bool = False,
    run_dir: str | None = None,
    timeout: float = 300.0,
    pin: dict[str, Any] | None = None,
    driver: str = "hooks",
    leaves: list[str] | None = None,
) -> dict[str, Any]:
    """Run one complete multi-process training; returns rank 0's record. ``leaves``: each rank's leaf
    switch name, given to it as ``FABRICPACE_LEAF`` (what a user sets from the cluster's topology)."""
    with tempfile.TemporaryDirectory(prefix="fp-pacing-") as tmp:
        out = Path(tmp) / "out.json"
        port = free_port()
        common = (
            [
                sys.executable,
                str(HERE),
                "--worker",
                "--world",
                str(world),
                "--port",
                str(port),
                "--pacing",
                pacing,
                "--steps",
                str(steps),
                "--window",
                str(window),
                "--global-batch",
                str(global_batch),
                "--hidden",
                str(hidden),
                "--churn",
                str(churn),
                "--heap",
                str(heap),
                "--survive",
                str(survive),
                "--slow-rank",
                str(slow_rank),
                "--slow-factor",
                str(slow_factor),
                "--slow-ms-per-sample",
                str(slow_ms_per_sample),
                "--bucket-mb",
                str(bucket_mb),
                "--out",
                str(out),
                "--config",
                json.dumps(config or {}),
                "--run-dir",
                run_dir or tmp,
                "--driver",
                driver,
            ]
            + (["--dump-params"] if dump_params else [])
            + (["--pin", json.dumps(pin)] if pin else [])
        )
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        procs = [
            subprocess.Popen(
                [*common, "--rank", str(r)],
                env=env | ({"FABRICPACE_LEAF": leaves[r]} if leaves else {}),
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in range(world)
        ]
        deadline = time.monotonic() + timeout
        errors = []
        try:
            for p in procs:
                _, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
                if p.returncode != 0:
                    errors.append(err[-2000:])
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if errors and out.exists():
            # Rank 0 writes its record after the final barrier, so every rank had finished training;
            # a worker that then dies while tearing down (seen once under heavy load: "terminate
            # called without an active exception" from a C++ thread at exit) leaves the result valid.
            print("warning: a worker failed after training completed (teardown):\n" + errors[0][-500:],
                  file=sys.stderr)
        elif errors:
            raise RuntimeError("worker failed:\n" + errors[0])
        return dict(json.loads(out.read_text()))


# ------------------------------------------------------------------------------------- statistics


def step_stats(rec: dict[str, Any], skip: int) -> tuple[float, float]:
    """(throughput in steps/s, CV of step time) over steps >= skip, from rank 0's rows.

    The global batch is the same every step, so steps/s ratios equal samples/s ratios.
    """
    rows = np.asarray(rec["rows"], dtype=np.float64)[skip:]
    dur = (rows[:, 1] - rows[:, 0]) / 1e9
    # Throughput over the wall time of those steps (includes window gathers and the controller).
    wall = (rows[-1, 1] - rows[0, 0]) / 1e9
    return float(len(rows) / wall), float(dur.std() / dur.mean())


def boot_ci(values: np.ndarray, *, seed: int = 0, n: int = 4000) -> tuple[float, float, float]:
    v = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(n, v.size))].mean(axis=1)
    lo, hi = np.quantile(means, [0.05, 0.95])
    return float(v.mean()), float(lo), float(hi)


SCENARIOS: dict[str, dict[str, Any]] = {
    "gc": {"b": "auto", "kw": {"churn": 3000, "heap": 100_000}},
    "slow": {"b": "rebalance", "kw": {"slow_rank": 1, "slow_ms_per_sample": 1.5}},
    "slow-auto": {"b": "auto", "kw": {"slow_rank": 1, "slow_ms_per_sample": 1.5}},
    "slow-cpu": {"b": "rebalance", "kw": {"slow_rank": 1, "slow_factor": 6}},
    "healthy": {"b": "auto", "kw": {}},
}


def kept_step(rec: dict[str, Any]) -> int | None:
    """First step after which the guard had kept a policy (None when nothing was kept)."""
    keeps = [d["step"] for d in rec["decisions"] if d["policy"] == "guard" and d["action"] == "keep"]
    return min(keeps) + 1 if keeps else None


def ab(name: str, *, pairs: int, steps: int, window: int, world: int, skip: int) -> dict[str, Any]:
    """ABBA pairs of complete runs; whole-run and steady-state (after the guard kept) ratios."""
    sc = SCENARIOS[name]
    thr, cvr, cvs_a, cvs_b, same, decisions, steady_thr, steady_cv = [], [], [], [], [], [], [], []
    for k in range(pairs):
        order = ("off", sc["b"]) if k % 2 == 0 else (sc["b"], "off")
        recs = {}
        for mode in order:
            recs[mode] = run_training(
                pacing=mode, world=world, steps=steps, window=window, dump_params=True, **sc["kw"]
            )
        a, b = recs["off"], recs[sc["b"]]
        ta, ca = step_stats(a, skip)
        tb, cb = step_stats(b, skip)
        thr.append(tb / ta)
        cvr.append(cb / ca)
        cvs_a.append(ca)
        cvs_b.append(cb)
        ks = kept_step(b)
        if ks is not None and ks < steps - window:
            sa, sca = step_stats(a, max(ks, skip))
            sb, scb = step_stats(b, max(ks, skip))
            steady_thr.append(sb / sa)
            steady_cv.append(scb / sca)
        pa, pb = np.asarray(a["params_f"]), np.asarray(b["params_f"])
        # gc and comm change only when things happen, so parameters stay bitwise equal; rebalance changes
        # the order of floating-point sums (allclose). Under "auto" a rank that is slower on this loaded
        # host can get a rebalance in any scenario, so each pair says which standard applies.
        moved = any(d["policy"] == "rebalance" and d["action"] == "enable" for d in b["decisions"])
        same.append(
            {
                "bitwise": a["params"] == b["params"],
                "max_abs_diff": float(np.abs(pa - pb).max()),
                "rebalance_acted": moved,
            }
        )
        decisions.append([f"{d['step']}:{d['policy']}/{d['action']}: {d['reason']}" for d in b["decisions"]])
        print(
            f"  [{name}] pair {k}: throughput x{tb / ta:.3f}  CV {ca:.3f} -> {cb:.3f}  kept from step {ks}  "
            f"params bitwise={same[-1]['bitwise']} maxdiff={same[-1]['max_abs_diff']:.2e}"
            + ("  (rebalance acted: allclose applies)" if moved else ""),
            file=sys.stderr,
        )
        for line in decisions[-1]:
            print(f"      {line}", file=sys.stderr)
    out: dict[str, Any] = {
        "scenario": name,
        "b": sc["b"],
        "pairs": pairs,
        "steps": steps,
        "window": window,
        "world": world,
        "skip_steps": skip,
        "throughput_gain": boot_ci(np.asarray(thr) - 1.0),
        "cv_reduction": boot_ci(1.0 - np.asarray(cvr)),
        "cv_off_median": float(np.median(cvs_a)),
        "cv_on_median": float(np.median(cvs_b)),
        "params": same,
        "decisions_last_pair": decisions[-1],
        "ratios": thr,
        "cv_ratios": cvr,
    }
    if steady_thr:
        out["steady_throughput_gain"] = boot_ci(np.asarray(steady_thr) - 1.0)
        out["steady_cv_reduction"] = boot_ci(1.0 - np.asarray(steady_cv))
        out["steady_pairs"] = len(steady_thr)
    return out


def hotpath(*, steps: int = 20000, buckets: int = 16, world: int = 4, window: int = 25) -> dict[str, float]:
    """Per-step cost (µs) of the pacer's hooks while it only watches: what a healthy `auto` run pays
    on every step when no trial runs (the controller's per-window cost is reported separately).

    Calls exactly what the observer calls per step: ``on_step_start``, ``batch_share``,
    ``before_bucket``/``after_bucket`` per bucket (only when a comm hook is installed) and
    ``on_step_end``; ``on_window`` once per window with a healthy window's summaries."""
    from fabricpace.pacing import make_pacer
    from fabricpace.run.window import WindowSummary

    def summaries(w: int) -> list[WindowSummary]:
        return [
            WindowSummary(
                rank=r, window=w, first_step=w * window, steps=window, step_mean_ns=3e7, step_median_ns=3e7,
                step_std_ns=1e6, compute_median_ns=2e7, compute_per_sample_ns=2e7 / 16, wait_mean_ns=5e6,
                comm_mean_ns=5e6, transfer_mean_ns=2e6, last_arrivals=4.0, collectives=16.0, data_mean_ns=0.0,
                gc_mean_ns=0.0, gc_count=0.0, paced_mean_ns=0.0, samples_mean=16.0, rss_bytes=1e9,
            )
            for r in range(world)
        ]

    out: dict[str, float] = {}
    for label, with_buckets in (("step hooks", False), ("step + bucket hooks", True)):
        p = make_pacer("auto", rank=1, world_size=world, run_dir=None, window=window)
        win_s = 0.0
        t0 = time.perf_counter_ns()
        for step in range(steps):
            p.on_step_start(step)
            p.batch_share(64)
            if with_buckets:
                for b in range(buckets):
                    p.before_bucket(b)
                    p.after_bucket(b)
            p.on_step_end(step)
            if (step + 1) % window == 0:
                w0 = time.perf_counter_ns()
                p.on_window(step, summaries(step // window))
                win_s += (time.perf_counter_ns() - w0) / 1e9
        total = (time.perf_counter_ns() - t0) / 1e9
        out[f"{label}: us per step"] = (total - win_s) / steps * 1e6
        out[f"{label}: controller ms per window"] = win_s / (steps // window) * 1e3
        out[f"{label}: trials"] = float(sum(d.action == "enable" for d in p.decisions))
        p.close()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--pacing", default="off")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--churn", type=int, default=0)
    ap.add_argument("--heap", type=int, default=0)
    ap.add_argument("--survive", type=int, default=0, help="steps churned objects stay alive")
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-factor", type=int, default=0)
    ap.add_argument("--slow-ms-per-sample", type=float, default=0.0)
    ap.add_argument("--bucket-mb", type=float, default=0.05)
    ap.add_argument("--out", default="")
    ap.add_argument("--config", default="")
    ap.add_argument("--run-dir", default=None)
    ap.add_argument("--dump-params", action="store_true")
    ap.add_argument(
        "--driver",
        choices=("hooks", "observer"),
        default="hooks",
        help="hooks: this script measures and calls the pacer; observer: fabricpace.observe does",
    )
    ap.add_argument("--pin", default="", help="JSON PacingState applied from step 0 (controller off)")
    ap.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--skip", type=int, default=20, help="steps excluded from the measurement (warm-up)")
    ap.add_argument("--json", default="", help="also write the results to this file")
    ap.add_argument("--hotpath", action="store_true", help="only time the pacer's per-step hooks (µs)")
    ap.add_argument(
        "--count-trials",
        type=int,
        default=0,
        metavar="N",
        help="run N healthy `auto` trainings (--driver) and count the trials the controller proposes",
    )
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        # Results are written and flushed. Skip interpreter teardown: torch's C++ static destructors can
        # abort ("terminate called without an active exception") while a gloo thread winds down,
        # which would turn a finished rank into a failed one (same as fabricpace.lab.worker).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    if args.hotpath:
        for k, v in hotpath(window=args.window).items():
            print(f"{k:45s} {v:10.2f}")
        return
    if args.count_trials:
        total = 0
        for i in range(args.count_trials):
            rec = run_training(pacing="auto", steps=args.steps, window=args.window, driver=args.driver)
            trials = [d for d in rec["decisions"] if d["action"] == "enable"]
            total += len(trials)
            load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
            print(f"healthy run {i}: {len(trials)} trial(s)  (load {load})", flush=True)
            for d in rec["decisions"]:
                print(f"    {d['step']}: {d['policy']}/{d['action']}: {d['reason']}", flush=True)
        print(f"trials proposed: {total} in {args.count_trials} healthy runs ({args.driver} driver)")
        return
    results = []
    for name in args.scenario or ["gc", "slow", "healthy"]:
        r = ab(name, pairs=args.pairs, steps=args.steps, window=args.window, world=args.world, skip=args.skip)
        results.append(r)
        t, c = r["throughput_gain"], r["cv_reduction"]
        plain = [p for p in r["params"] if not p["rebalance_acted"]]
        moved = [p for p in r["params"] if p["rebalance_acted"]]
        bit = f"{sum(p['bitwise'] for p in plain)}/{len(plain)}"
        md = max((p["max_abs_diff"] for p in moved), default=0.0)
        print(
            f"{name:8s} {r['b']:9s} vs off: throughput {t[0] * 100:+.1f}% "
            f"(90% CI {t[1] * 100:+.1f}..{t[2] * 100:+.1f})"
            f"  CV {r['cv_off_median']:.3f}->{r['cv_on_median']:.3f} reduction {c[0] * 100:+.0f}% "
            f"(CI {c[1] * 100:+.0f}..{c[2] * 100:+.0f})  params bitwise in {bit} pairs without "
            f"rebalance; {len(moved)} with rebalance, max|diff|={md:.1e}  "
            f"n={r['pairs']} pairs x {r['steps']} steps"
        )
        if "steady_throughput_gain" in r:
            st, sc = r["steady_throughput_gain"], r["steady_cv_reduction"]
            print(
                f"{'':8s} {'':9s} after the guard kept it ({r['steady_pairs']} pairs): throughput "
                f"{st[0] * 100:+.1f}% (CI {st[1] * 100:+.1f}..{st[2] * 100:+.1f})  CV reduction "
                f"{sc[0] * 100:+.0f}% (CI {sc[1] * 100:+.0f}..{sc[2] * 100:+.0f})"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
