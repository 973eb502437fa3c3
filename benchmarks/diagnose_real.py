"""Does ``fabricpace diagnose`` tell the truth on real ranks, blind? Real gloo DDP jobs on this machine
(N ranks, a few hundred short steps, under the observer), each with one known injected cause, diagnosed
by the real CLI (``fabricpace diagnose RUN --format json``) and scored against the truth.

    nice -n 10 .venv/bin/python benchmarks/diagnose_real.py run --out /tmp/d10/m1 --repeats 2
    .venv/bin/python benchmarks/diagnose_real.py score --out /tmp/d10/m1 [--src OLD/src] [--json]

``run`` records every run (cases × background load × repeats, in a shuffled order so that the
machine's load drifts do not line up with one case) and scores them; ``score`` re-diagnoses the
recorded run directories, optionally with another checkout's code (``--src``: before/after on the same
recorded runs). The ranks are started the way torchrun starts them (env:// rendezvous: MASTER_ADDR,
RANK, WORLD_SIZE, ...) but without its launcher process, so that one rank can be put in a cgroup by PID
and the 2-core machine pays one torch start-up per rank only.

Cases (``R`` = the target rank, by default the last one):
  healthy      nothing injected                          truth: healthy
  compute      R does extra matrix work per sample       truth: persistent_straggler [R]
  throttle     R in a cgroup v1 CPU quota (0.08 CPU)     truth: persistent_straggler [R]
  gc_all       Python GC churn (cycles + survivors) on all ranks   truth: sync_amplification
  gc_one       the same churn on R only                  truth: persistent_straggler [R]
  data         R sleeps inside obs.phase("data")          truth: input_stall [R]
  pause        R pauses (sleep) every few steps          truth: persistent_straggler [R]
  late_half    R sleeps in every step of the second half truth: persistent_straggler [R]
  two_slow     R and R-2 sleep in every step             truth: persistent_straggler [R-2, R]
  demo         the demo's real run (``fabricpace lab run --backend local`` on its scenario
               local-noisy.yaml: GC pressure on all 4 ranks, rank 2 CPU-throttled)
                                                         truth: persistent_straggler [2] + sync_amplification
Each case also runs with background CPU load (``+load``: spinning processes of this script, killed by
PID). Not a pass/fail test.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CASES = ("healthy", "compute", "throttle", "gc_all", "gc_one", "data", "pause", "late_half", "two_slow",
         "demo")
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP_NAME = "d10-diagnose-real"  # this script's own cgroup, removed after each throttled run


def truth(case: str, world: int) -> tuple[str, list[int]]:
    """(mode, culprit ranks) that a correct diagnosis names for this case."""
    r = world - 1
    return {
        "healthy": ("healthy", []),
        "compute": ("persistent_straggler", [r]),
        "throttle": ("persistent_straggler", [r]),
        "gc_all": ("sync_amplification", []),
        "gc_one": ("persistent_straggler", [r]),
        "data": ("input_stall", [r]),
        "pause": ("persistent_straggler", [r]),
        "late_half": ("persistent_straggler", [r]),
        "two_slow": ("persistent_straggler", [r - 2, r]),
        "demo": ("persistent_straggler", [2]),
    }[case]


ALSO_TRUE = {"demo": ["sync_amplification"]}  # injected too (GC pressure on every rank)


# ----------------------------------------------------------------------------------------------- worker


def _churn(n: int, keep: collections.deque[object]) -> None:
    """Allocate n reference cycles; every 8th survives a while in ``keep`` (so objects reach the older
    generations and full collections, the long pauses, happen now and then)."""
    for i in range(n):
        a: list[object] = [None] * 4
        a.append(a)
        if i % 8 == 0:
            keep.append(a)


def _run_delay_ns() -> int:
    with open("/proc/self/schedstat") as fh:
        return int(fh.read().split()[1])


def worker(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from fabricpace.observe import ObserverConfig, observe

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(a.seed)
    layers: list[torch.nn.Module] = [torch.nn.Linear(64, 256), torch.nn.ReLU()]
    for _ in range(3):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(256, 10))
    model = DDP(torch.nn.Sequential(*layers), bucket_cap_mb=0.25)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1000 * a.seed + rank)
    targets = {world - 1, world - 3} if a.case == "two_slow" else {world - 1}
    me = rank in targets
    rng = random.Random(a.seed * 7919 + rank)
    keep: collections.deque[object] = collections.deque(maxlen=20_000)
    heavy = torch.randn(512, 512, generator=gen)
    n = a.batch // world
    next_pause = rng.randint(3, 9)
    obs = observe(model, run_dir=a.run_dir, window=50,
                             config=ObserverConfig(flush_every=100, flush_interval_s=10.0))
    # Independent record of OS noise: the main thread's run-queue wait (runnable, not running) per step,
    # from /proc/self/schedstat — the part of the step the scheduler took away from this rank.
    delay: list[int] = []
    with obs:
        for step in range(a.steps):
            d0 = _run_delay_ns()
            with obs.step(samples=n):
                with obs.phase("data"):
                    x = torch.randn(n, 64, generator=gen)
                    y = torch.randint(0, 10, (n,), generator=gen)
                    if a.case == "data" and me:
                        time.sleep(a.ms / 1e3)
                if a.case == "compute" and me:
                    # extra own work proportional to the samples: a.extra matrix products per sample
                    rows = torch.randn(n, 512, generator=gen)
                    for _ in range(a.extra):
                        rows = torch.tanh(rows @ heavy)
                if me and (a.case == "two_slow" or (a.case == "late_half" and step >= a.steps // 2)):
                    time.sleep(a.ms / 1e3)
                if a.case == "pause" and me and step == next_pause:
                    time.sleep(4 * a.ms / 1e3)
                    next_pause = step + rng.randint(3, 9)
                if a.case == "gc_all" or (a.case == "gc_one" and me):
                    _churn(a.churn, keep)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            delay.append(_run_delay_ns() - d0)
    side = Path(a.run_dir + ".sched")
    side.mkdir(exist_ok=True)
    (side / f"rank-{rank}.json").write_text(json.dumps({"run_delay_ns": delay}))
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------ runner


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _cgroup(cpus: float, period_us: int = 20_000):  # type: ignore[no-untyped-def]
    """This script's own cgroup v1 CPU quota; removed on exit (its tasks have ended by then)."""
    path = CGROUP_CPU / CGROUP_NAME
    path.mkdir(exist_ok=True)
    # A cgroup competes as one entity with weight cpu.shares (1024 = a nice-0 task). The ranks run at
    # this script's niceness (nice 10: weight ~110), so left at 1024 the "throttled" rank would outrank
    # its peers ~9x whenever it is under quota (seen in session 9: it computed 3x faster than them).
    (path / "cpu.shares").write_text(str(max(2, round(1024 / 1.25 ** os.nice(0)))))
    (path / "cpu.cfs_period_us").write_text(str(period_us))
    (path / "cpu.cfs_quota_us").write_text(str(int(cpus * period_us)))
    try:
        yield path
    finally:
        for _ in range(50):
            try:
                path.rmdir()
                break
            except OSError:
                time.sleep(0.1)


@contextlib.contextmanager
def _load(n: int):  # type: ignore[no-untyped-def]
    """n spinning processes (background CPU load), killed by PID on exit."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()


def _throttled_ns(path: Path) -> int:
    for line in (path / "cpu.stat").read_text().splitlines():
        k, _, v = line.partition(" ")
        if k == "throttled_time":
            return int(v)
    return 0


def _record_demo(load: int, seed: int, run_dir: Path, a: argparse.Namespace) -> dict[str, Any]:
    """The demo's local run, through the real CLI (its own launcher, cgroup and GC pressure)."""
    from importlib import resources

    scenario = resources.files("fabricpace") / "data" / "demo" / "local-noisy.yaml"
    exe = Path(sys.executable).with_name("fabricpace")
    t0, load0 = time.time(), os.getloadavg()[0]
    with _load(load):
        r = subprocess.run([str(exe), "lab", "run", "--backend", "local", "--scenario", str(scenario),
                            "--pacing", "off", "--seed", str(seed), "--out", str(run_dir)],
                           capture_output=True, text=True, timeout=a.timeout)
    mode, culprits = truth("demo", 4)
    return {"case": "demo", "load": load, "seed": seed, "run_dir": str(run_dir), "rc": r.returncode,
            "wall_s": time.time() - t0, "loadavg_start": load0, "loadavg_end": os.getloadavg()[0],
            "truth_mode": mode, "truth_culprits": culprits,
            "tail": "" if r.returncode == 0 else r.stderr[-800:]}


def record(case: str, load: int, seed: int, run_dir: Path, a: argparse.Namespace) -> dict[str, Any]:
    """One real job; returns what the index keeps about it (not yet diagnosed)."""
    if case == "demo":
        return _record_demo(load, seed, run_dir, a)
    port = _free_port()
    world = a.nproc
    cmd = [sys.executable, str(Path(__file__).resolve()), "worker", "--case", case, "--seed", str(seed),
           "--steps", str(a.steps), "--run-dir", str(run_dir), "--ms", str(a.ms), "--extra", str(a.extra),
           "--churn", str(a.churn), "--batch", str(a.batch)]
    t0 = time.time()
    load0 = os.getloadavg()[0]
    extra: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        cg = stack.enter_context(_cgroup(a.throttle_cpus)) if case == "throttle" else None
        stack.enter_context(_load(load))
        procs = []
        for rank in range(world):
            env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(world))
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            procs.append(p)
            if cg is not None and rank == world - 1:
                (cg / "cgroup.procs").write_text(str(p.pid))
        outs = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=a.timeout)
            except subprocess.TimeoutExpired:
                for q in procs:
                    if q.poll() is None:
                        q.kill()
                out, _ = p.communicate()
            outs.append(out)
        if cg is not None:
            extra["throttled_ms"] = _throttled_ns(cg) / 1e6
    rc = max(p.returncode for p in procs)
    mode, culprits = truth(case, world)
    return {"case": case, "load": load, "seed": seed, "run_dir": str(run_dir), "rc": rc,
            "wall_s": time.time() - t0, "loadavg_start": load0, "loadavg_end": os.getloadavg()[0],
            "truth_mode": mode, "truth_culprits": culprits,
            "tail": "" if rc == 0 else "\n".join(o[-800:] for o in outs), **extra}


def diagnose_cli(run_dir: str, src: str | None) -> dict[str, Any]:
    """The real CLI on one run directory; ``src``: another checkout's ``src`` (before/after)."""
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    cmd = [sys.executable, "-c", "import sys; from fabricpace.cli.app import main; sys.exit(main())",
           "diagnose", run_dir, "--format", "json"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1:] or [f"exit {r.returncode}"]}
    return dict(json.loads(r.stdout))


OS_NOISE_MIN = 0.05  # the diagnosis's sync_min_share: OS skew above it is a real sync loss


def judge(rec: dict[str, Any], d: dict[str, Any]) -> dict[str, Any]:
    """Named modes; whether the injected cause was named with its culprits (strict); and whether every
    named mode is true of the run (machine-aware: sync_amplification is also true when the ranks'
    independently measured run-queue skew is itself ≥ 5% of step time — the machine's own noise)."""
    if "error" in d:
        return {"verdict": "error", "modes": [], "mode_right": False, "culprit_right": False,
                "false_modes": [], "machine_right": False}
    verdict = d["runs"][0]["verdict"]
    modes = list(dict.fromkeys(f["mode"] for f in d["findings"]))
    want = rec["truth_mode"]
    os_share = rec.get("os_skew_share")
    allowed = {want, *ALSO_TRUE.get(rec["case"], [])}
    if os_share is not None and os_share >= OS_NOISE_MIN:
        allowed.add("sync_amplification")
    false_modes = [m for m in modes if m not in allowed]
    named_ranks = sorted({r for g in d["findings"] for r in g["culprits"]["ranks"]
                          if g["mode"] != "sync_amplification"})
    if want == "healthy":
        ok = bool(d["healthy"])
        return {"verdict": verdict, "modes": modes, "mode_right": ok, "culprit_right": ok,
                "named_ranks": named_ranks, "false_modes": false_modes,
                "machine_right": not false_modes and not named_ranks and verdict != "undecided"}
    f = next((f for f in d["findings"] if f["mode"] == want), None)
    culprit_ok = f is not None and sorted(f["culprits"]["ranks"]) == sorted(rec["truth_culprits"])
    if want == "sync_amplification":
        culprit_ok = f is not None and not named_ranks
    return {"verdict": verdict, "modes": modes, "mode_right": f is not None, "culprit_right": culprit_ok,
            "named_ranks": named_ranks, "false_modes": false_modes,
            "machine_right": culprit_ok and not false_modes}


def _label(rec: dict[str, Any]) -> str:
    return rec["case"] + ("+load" if rec["load"] else "")


def _med_os(rs: list[dict[str, Any]]) -> str:
    v = sorted(r["os_skew_share"] for r in rs if r.get("os_skew_share") is not None)
    return f"{100 * v[len(v) // 2]:.1f}" if v else "-"


def table(rows: list[dict[str, Any]]) -> str:
    """Confusion matrix: truth case × named-mode combination (n per cell), and culprit right/wrong."""
    combos: collections.Counter[tuple[str, str]] = collections.Counter()
    per: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in rows:
        named = "+".join(sorted(r["judged"]["modes"])) or ("healthy" if r["judged"]["verdict"] == "healthy"
                                                             else r["judged"]["verdict"])
        combos[(_label(r), named)] += 1
        per[_label(r)].append(r)
    cols = sorted({c for _, c in combos})
    short = {"persistent_straggler": "strag", "sync_amplification": "sync", "input_stall": "input",
             "topology_contention": "topo", "stage_imbalance": "stage"}

    def s(c: str) -> str:
        for k, v in short.items():
            c = c.replace(k, v)
        return c

    order = [c + suf for suf in ("", "+load") for c in CASES]
    w = max([12, *(len(s(c)) + 2 for c in cols)])
    lines = ["truth".ljust(16) + "".join(s(c).rjust(w) for c in cols)
             + "   n  mode✓  culprit✓  all-true✓  OS-skew% (median)"]
    tot = [0, 0, 0, 0]
    for lab in order:
        if lab not in per:
            continue
        rs = per[lab]
        mode_ok = sum(r["judged"]["mode_right"] for r in rs)
        cul_ok = sum(r["judged"]["culprit_right"] for r in rs)
        all_ok = sum(r["judged"]["machine_right"] for r in rs)
        tot = [tot[0] + len(rs), tot[1] + mode_ok, tot[2] + cul_ok, tot[3] + all_ok]
        lines.append(lab.ljust(16) + "".join(str(combos.get((lab, c), "")).rjust(w) for c in cols)
                     + f"{len(rs):4d}{mode_ok:7d}{cul_ok:10d}{all_ok:11d}  {_med_os(rs)}")
    lines.append(f"total: n={tot[0]}, injected mode named {tot[1]}, mode and culprit right {tot[2]}, "
                 f"and every named mode true of the run (machine-aware) {tot[3]}")
    return "\n".join(lines)


def os_skew_share(run_dir: str, culprits: list[int]) -> float | None:
    """The machine's own synchronization loss: per step, the largest run-queue wait of a rank above the
    median rank's (the same skew rule the diagnosis applies to arrivals, on an independent signal), as a
    share of step time, after the diagnosis's warm-up, over the ranks that are not injected culprits
    (like the diagnosis's residual skew). None when the side record is missing."""
    import numpy as np

    from fabricpace.run.reader import load_run

    side = Path(run_dir + ".sched")
    files = [f for f in sorted(side.glob("rank-*.json")) if int(f.stem.split("-")[1]) not in culprits]
    if not files:
        return None
    delay = np.array([json.loads(f.read_text())["run_delay_ns"] for f in files], dtype=float)
    steps = load_run(Path(run_dir), tables=["steps"]).steps
    dur = (steps["t_end_ns"] - steps["t_start_ns"]).to_numpy().astype(float)
    st = steps["step"].to_numpy()
    n = min(delay.shape[1], int(st.max()) + 1)
    per_step = np.full(n, np.nan)
    for k in range(n):  # a few hundred steps: a loop is clearer than a scatter here
        sel = dur[st == k]
        per_step[k] = np.median(sel) if sel.size else np.nan
    warm = min(20, max(1, n // 10))
    d = delay[:, warm:n]
    skew = d.max(axis=0) - np.median(d, axis=0)
    return float(np.nansum(skew) / np.nansum(per_step[warm:]))


def score(out: Path, src: str | None) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (out / "index.jsonl").read_text().splitlines() if x.strip()]
    scored = []
    for r in rows:
        if r["rc"] != 0:
            continue
        d = diagnose_cli(r["run_dir"], src)
        r["os_skew_share"] = os_skew_share(r["run_dir"], r["truth_culprits"])
        r["judged"] = judge(r, d)
        r["findings"] = [{k: f[k] for k in ("mode", "severity_pct", "culprits")}
                         for f in d.get("findings", [])]
        scored.append(r)
    return scored


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--case", choices=CASES, required=True)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--steps", type=int, default=240)
    w.add_argument("--run-dir", required=True)
    w.add_argument("--ms", type=float, default=10.0)
    w.add_argument("--extra", type=int, default=8)
    w.add_argument("--churn", type=int, default=4000)
    w.add_argument("--batch", type=int, default=32)
    rp = sub.add_parser("run")
    rp.add_argument("--out", type=Path, required=True)
    rp.add_argument("--repeats", type=int, default=2, help="runs per case and load (healthy: twice that)")
    rp.add_argument("--cases", default=",".join(CASES))
    rp.add_argument("--loads", default="0,3", help="spinning processes per run, comma-separated")
    rp.add_argument("--nproc", type=int, default=4)
    rp.add_argument("--steps", type=int, default=240)
    rp.add_argument("--ms", type=float, default=10.0, help="injected sleep, ms (pause: 4x, every 3-9 steps)")
    rp.add_argument("--extra", type=int, default=8, help="compute case: extra 512x512 products per sample")
    rp.add_argument("--churn", type=int, default=4000, help="gc cases: reference cycles per step")
    rp.add_argument("--batch", type=int, default=32)
    rp.add_argument("--throttle-cpus", type=float, default=0.08, help="CPU quota of the throttled rank "
                    "(the demo's 0.08; at 0.3 a shared host at load ~20 gives every rank less than that)")
    rp.add_argument("--timeout", type=float, default=240.0)
    rp.add_argument("--order-seed", type=int, default=0)
    rp.add_argument("--json", action="store_true")
    s = sub.add_parser("score")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--src", default=None, help="diagnose with this checkout's src/ (before/after)")
    s.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.cmd == "worker":
        worker(a)
        sys.stdout.flush()
        os._exit(0)  # torch 2.13's gloo teardown can abort a finished rank at exit (see ddp_train.py)
    if a.cmd == "run":
        cases = [c.strip() for c in a.cases.split(",") if c.strip()]
        loads = [int(x) for x in a.loads.split(",")]
        plan = [(c, ld, k) for c in cases for ld in loads
                for k in range(a.repeats * (2 if c == "healthy" else 1))]
        random.Random(a.order_seed).shuffle(plan)
        a.out.mkdir(parents=True, exist_ok=True)
        index = a.out / "index.jsonl"
        done = {(x["case"], x["load"], x["seed"]) for x in map(json.loads, index.read_text().splitlines())
                if x} if index.exists() else set()
        for i, (case, load, k) in enumerate(plan):
            seed = 100 + k
            if (case, load, seed) in done:
                continue
            run_dir = a.out / f"{case}-L{load}-s{seed}"
            shutil.rmtree(run_dir, ignore_errors=True)
            rec = record(case, load, seed, run_dir, a)
            with index.open("a") as fh:
                fh.write(json.dumps(rec) + "\n")
            print(f"[{i + 1}/{len(plan)}] {case} load={load} seed={seed} rc={rec['rc']} "
                  f"{rec['wall_s']:.0f}s loadavg {rec['loadavg_start']:.1f}", file=sys.stderr, flush=True)
    rows = score(a.out, getattr(a, "src", None))
    (a.out / ("scored-" + ("src" if getattr(a, "src", None) else "cur") + ".json")).write_text(
        json.dumps(rows, indent=1))
    if a.json:
        print(json.dumps(rows))
    else:
        print(table(rows))
        for r in rows:
            j = r["judged"]
            if not j["machine_right"]:
                print(f"  miss: {Path(r['run_dir']).name}: named {j['modes'] or j['verdict']} "
                      f"ranks {j.get('named_ranks')}; OS skew {r.get('os_skew_share') or 0:.1%}")


if __name__ == "__main__":
    main()
