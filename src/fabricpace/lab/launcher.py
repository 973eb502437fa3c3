"""Run a scenario: one worker per rank (inside a lab namespace, or on loopback), faults applied around it.

The launcher owns everything outside the training loop: it brings up the fabric the scenario asks for
(idempotent), starts the ranks with rendezvous on the lab network, moves throttled ranks into cgroups,
starts the foreign flow, changes the uplink rate on time, waits with a deadline, and always cleans up
the processes, cgroups and shaping it touched. Afterwards it writes the lab's topology (rank -> node ->
leaf) into ``ranks.parquet`` and the manifest, and the fault timeline into ``lab/lab.json``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabricpace._errors import InputError, LabError
from fabricpace.lab import cgroup, fabric, mirror, state, traffic
from fabricpace.lab.annotate import annotate
from fabricpace.lab.config import LabConfig, parse_rate
from fabricpace.lab.scenario import Scenario
from fabricpace.run.destination import check_new_dir

HOSTNAME_ENV = "FABRICPACE_LAB_HOSTNAME"  # the worker's host name inside the lab (its node's namespace)
MASTER_PORT = 29511  # inside the lab's own namespaces; local runs pick a free loopback port
LOCAL_PREFIX = "fpl-"  # cgroups of local runs (root only) are recorded under this prefix
FOREIGN_MAX_S = 1800.0
# Resident memory of one rank (torch, gloo, the observer, the MLP): 390 MB measured in a healthy run,
# 450 MB with gc-noise's 200k-object heap. 64 ranks need ~29 GB, more than many machines have.
RANK_MEMORY_BYTES = 450 * 2**20


def mem_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_memory(world: int) -> None:
    """InputError, before anything starts, when ``world`` ranks would not fit in the memory left:
    they were started anyway, and the kernel's OOM killer chose among them and the user's programs."""
    avail = mem_available_bytes()
    if avail is None or world * RANK_MEMORY_BYTES <= avail:
        return
    fits = avail // RANK_MEMORY_BYTES
    raise InputError(
        f"--nodes {world}: {world} ranks need about {world * RANK_MEMORY_BYTES / 2**30:.1f} GiB of memory "
        f"(~{RANK_MEMORY_BYTES // 2**20} MiB each) and this machine has {avail / 2**30:.1f} GiB available; "
        + (f"use --nodes {fits} or fewer" if fits >= 2 else "free some memory first")
    )


# Ranks per CPU above which step times measure the CPU scheduler more than the scenario (the ranks'
# compute and gloo's waits share the cores); 8 gloo ranks on 2 cores is what the lab is tested with.
RANKS_PER_CPU = 4


def cpu_warning(world: int) -> str | None:
    """A warning when ``world`` ranks crowd this machine's CPUs (the run still starts: it works, slowly)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if world <= RANKS_PER_CPU * cpus:
        return None
    plural = "s" if cpus > 1 else ""
    return (f"--nodes {world} on {cpus} CPU{plural}: {world / cpus:.0f} ranks per CPU, so step "
            f"times will mostly measure CPU scheduling and the run may pass its deadline; "
            f"--nodes {max(2, RANKS_PER_CPU * cpus)} or fewer keeps the scenario's effects visible")


@dataclass
class _Run:
    """Everything one scenario run started, so cleanup can end exactly that."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    helpers: list[subprocess.Popen[str]] = field(default_factory=list)
    cgroups: list[Path] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    # cpu.stat throttled_time of each cgroup, read at cleanup (the counters go with the cgroup)
    throttled_ns: dict[str, int] = field(default_factory=dict)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scratch_dir(out: Path) -> Path:
    """Logs and fault records live beside the run directory while the run is going (the observer
    only writes into an empty directory), and move to RUN/lab afterwards."""
    return out.parent / f".{out.name}.lab"


def _prepare_out(out: Path) -> Path:
    check_new_dir(out, what="run directory")
    scratch = scratch_dir(out)
    if scratch.exists():
        shutil.rmtree(scratch)
    (scratch / "logs").mkdir(parents=True)
    return scratch


def worker_args(sc: Scenario, *, run_dir: Path, steps: int, pacing: str, seed: int,
                slow: tuple[str, float] | None = None) -> list[str]:
    """Command-line flags of ``python -m fabricpace.lab.worker`` for this scenario."""
    w = sc.workload
    args = ["--run-dir", str(run_dir), "--steps", str(steps), "--batch-per-rank", str(w.batch_per_rank),
            "--device-ms-per-sample", str(w.device_ms_per_sample),
            "--in-dim", str(w.in_dim), "--hidden", str(w.hidden), "--layers", str(w.layers),
            "--window", str(w.window), "--pacing", pacing, "--seed", str(seed),
            "--progress-file", str(scratch_dir(run_dir) / "progress")]
    g = sc.faults.gc_noise
    if g is not None:
        ranks = "all" if g.ranks == "all" else ",".join(str(r) for r in g.ranks)
        args += ["--gc-noise-ranks", ranks, "--gc-heap", str(g.heap), "--gc-churn", str(g.churn),
                 "--gc-lifetime", str(g.lifetime)]
    if slow is not None:
        args += ["--slow-ranks", slow[0], "--slow-factor", str(slow[1])]
    return args


def _spawn_workers(sc: Scenario, run: _Run, *, world: int, out: Path, args: list[str],
                   cfg: LabConfig | None, rank_node: list[int]) -> None:
    base = dict(os.environ)
    base.update({"WORLD_SIZE": str(world), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                 "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    if cfg is not None:
        base.update({"MASTER_ADDR": cfg.node_addr(rank_node[0]), "MASTER_PORT": str(MASTER_PORT),
                     "GLOO_SOCKET_IFNAME": cfg.NODE_IFACE})
    else:
        base.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
                     "GLOO_SOCKET_IFNAME": "lo"})
    for rank in range(world):
        env = base | {"RANK": str(rank), "GROUP_RANK": str(rank_node[rank])}
        if cfg is not None:  # what a user sets from the cluster's topology (observer: locality.leaf_name)
            env["FABRICPACE_LEAF"] = cfg.leaf_bridge(cfg.leaf_of(rank_node[rank]))
            # Each node its own host name, as real nodes have (the worker sets it in a UTS namespace of
            # its own): the observer's manifest then counts the nodes from the start, so a run whose
            # launcher was killed (no annotation at the end) no longer claims "4 ranks / 1 node".
            env[HOSTNAME_ENV] = cfg.node_ns(rank_node[rank])
        cmd = [sys.executable, "-m", "fabricpace.lab.worker", *args]
        if cfg is not None:
            cmd = ["ip", "netns", "exec", cfg.node_ns(rank_node[rank]), *cmd]
        log = open(scratch_dir(out) / "logs" / f"rank-{rank:05d}.log", "wb")  # noqa: SIM115 - closed by the child
        try:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        run.procs.append(proc)
        if cfg is not None:
            state.record_pid(cfg.prefix, proc.pid, f"rank {rank}")  # `ip netns exec` execs: same PID


def _start_foreign(cfg: LabConfig, sc: Scenario, run: _Run, out: Path, deadline_s: float) -> None:
    ff = sc.faults.foreign_flow
    assert ff is not None
    if not cfg.foreign_hosts or cfg.leaves < 2:
        raise LabError("the foreign-flow fault needs a lab with 2+ leaves and foreign hosts")
    dur = min(deadline_s, FOREIGN_MAX_S)
    cap = int(cfg.uplink_bps / 8 * dur * 1.5)  # bounded: never more than the uplink could carry
    recv = traffic.spawn_in_ns(cfg, cfg.foreign_ns(1), ["recv", "--port", str(traffic.FOREIGN_PORT),
                               "--duration", str(dur), "--max-bytes", str(cap), "--streams", str(ff.streams)],
                               "foreign-recv")
    run.helpers.append(recv)
    assert recv.stdout is not None
    if recv.stdout.readline().strip() != "listening":
        raise LabError("foreign-flow receiver did not start")
    send = traffic.spawn_in_ns(cfg, cfg.foreign_ns(0), [
        "send", "--addr", cfg.foreign_addr(1), "--port", str(traffic.FOREIGN_PORT), "--duration", str(dur),
        "--max-bytes", str(cap), "--streams", str(ff.streams), "--on", str(ff.on_s), "--off", str(ff.off_s),
        "--log", str(scratch_dir(out) / "foreign.json")], "foreign-send")
    run.helpers.append(send)
    run.events.append({"event": "foreign_flow_start", "unix_s": time.time(), "streams": ff.streams})


def _cleanup(run: _Run, cfg: LabConfig | None, prefix: str) -> None:
    everything: list[subprocess.Popen[Any]] = [*run.procs, *run.helpers]
    for proc in everything:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    for proc in everything:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for path in run.cgroups:
        run.throttled_ns[path.name.split("-")[0]] = cgroup.throttled_time_ns(path)  # "rank1"
        with contextlib.suppress(OSError):
            path.rmdir()
    root = cgroup.cgroup_root(prefix)
    with contextlib.suppress(OSError):
        if root.exists() and not any(p.is_dir() for p in root.iterdir()):
            root.rmdir()
    if cfg is not None:
        state.forget_pids(prefix, [p.pid for p in everything])
        with state.locked(prefix) as st:
            st["cgroups"] = [c for c in st["cgroups"] if Path(c).exists()]
    elif state.state_path(prefix).exists():
        with state.locked(prefix) as st:  # other local runs may still record theirs here
            st["cgroups"] = [c for c in st["cgroups"] if Path(c).exists()]
            left = bool(st["cgroups"])
        if not left:
            state.remove(prefix)


def _tail(path: Path, n: int = 3) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def _throttle(run: _Run, ranks: list[int], cpus: float, prefix: str, world: int) -> None:
    # One cgroup per run and rank (the launcher's PID in the name): local runs all record their cgroups
    # under fpl-, and two of them throttling rank 1 shared fpl-lab/rank1, so each rank got half the quota
    # and each run's lab.json reported the other's throttled time as its own.
    for r in ranks:
        if 0 <= r < world:
            path = cgroup.throttle(prefix, f"rank{r}-{os.getpid()}", run.procs[r].pid, cpus)
            run.cgroups.append(path)
            run.events.append({"event": "throttle", "rank": r, "cpus": cpus, "unix_s": time.time(),
                               "cgroup": str(path)})


def _wait(run: _Run, sc: Scenario, *, out: Path, steps: int, deadline_s: float, cfg: LabConfig | None,
          progress: bool, on_start: Callable[[], None] | None = None) -> None:
    """Wait for every rank; apply the timed uplink change; fail fast when a rank dies."""
    from rich.progress import Progress

    change = sc.faults.uplink_change if cfg is not None else None
    foreign = sc.faults.foreign_flow if cfg is not None else None
    progress_file = scratch_dir(out) / "progress"
    t_start = time.monotonic()
    t_first_step: float | None = None
    done = 0  # rank 0's steps so far (its progress file: every 10 steps, and `steps` once it is through)
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task(f"lab run {sc.name}", total=steps)
        while True:
            codes = [p.poll() for p in run.procs]
            bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                r, c = bad[0]
                log = scratch_dir(out) / "logs" / f"rank-{r:05d}.log"
                raise LabError(f"rank {r} exited with {c}: {_tail(log)[-300:]} (log: {log})")
            if all(c == 0 for c in codes):
                run.events.append({"event": "ranks_done", "after_s": round(time.monotonic() - t_start, 2)})
                return
            if time.monotonic() - t_start > deadline_s:
                raise LabError(f"scenario {sc.name} did not finish within {deadline_s:.0f} s; "
                               f"logs in {scratch_dir(out)}")
            with contextlib.suppress(OSError, ValueError):
                done = int(progress_file.read_text() or 0)
                bar.update(task, completed=done)
                if t_first_step is None:
                    t_first_step = time.monotonic()
                    run.events.append({"event": "training_started",
                                       "after_s": round(t_first_step - t_start, 2)})
                    if on_start is not None:
                        # Throttle only once training runs: a quota during start-up (imports,
                        # rendezvous) would only make the run slower, not the fault stronger.
                        on_start()
                    if foreign is not None:
                        # Only now: the observer has aligned clocks over the (then quiet) network.
                        assert cfg is not None
                        _start_foreign(cfg, sc, run, out, deadline_s)
            started = t_first_step is not None and time.monotonic() - t_first_step >= 0
            if change is not None and started and time.monotonic() - (t_first_step or 0) >= change.after_s:
                assert cfg is not None
                # When it lands, relative to the steps: a change due once rank 0 is through its steps
                # is not made (it came 0.5 s before the ranks were done, every transfer had run at the
                # old rate, and the report said "applied"); the others carry the clock reading that
                # annotate.place_changes turns into the steps that ran under them.
                event = {"event": "uplink_change", "unix_s": time.time(), "rate": change.rate,
                         "progress_step": done, "steps": steps, "applied": done < steps}
                if done < steps:
                    fabric.set_uplink_rate(cfg, parse_rate(change.rate))
                    event["monotonic_ns"] = time.perf_counter_ns()  # the observer's clock (t0.json)
                run.events.append(event)
                change = None
            time.sleep(0.2)


class LabBusy(InputError):
    """Another process holds the lab's run claim (nothing of this run was started or removed)."""


def run_scenario(sc: Scenario, *, out: Path, pacing: str = "off", steps: int | None = None,
                 nodes: int | None = None, seed: int = 0, backend: str = "lab", prefix: str = "fp-",
                 progress: bool = False, deadline_s: float | None = None,
                 down_after: bool = False, placement: str | list[int] | None = None) -> dict[str, Any]:
    """Run ``sc`` and return a summary; the run directory is ``out``.

    ``placement`` (lab backend) replaces the scenario's: contiguous, interleaved, node ids in rank order
    or a hosts file (``fabricpace place``'s proposed hostfile; lab/mirror.py).

    ``down_after`` (lab backend): take the lab down when the run ends, however it ends, but only when
    this run held the lab: a run refused because another process holds it (LabBusy) touches nothing.
    (``study --backend lab`` used to call ``lab down`` in a ``finally`` around this call, so a refused
    second study ended the first study's ranks and deleted its namespaces.)"""
    if placement is not None:
        sc = sc.model_copy(update={"placement": placement})
    world = nodes or sc.world
    steps = steps or sc.steps
    if world < 2:
        raise InputError(f"--nodes {world}: a lab run needs at least 2 ranks")
    out = Path(out)
    if backend not in ("lab", "local"):
        raise InputError(f"--backend {backend!r}: choose lab or local")
    with contextlib.ExitStack() as claim:
        if backend == "lab":
            fabric.require_lab()
            try:
                claim.enter_context(state.run_claim(prefix))
            except state.RunClaimed as exc:
                raise LabBusy(
                    f"lab {prefix} is in use by another lab run; starting another run in it would end it: "
                    f"wait for it to finish, use another --prefix, or stop it with "
                    f"`fabricpace lab down --prefix {prefix}`") from exc
            if down_after:
                claim.callback(_down_after, prefix)  # runs while the claim is still held
        try:
            result = _run_claimed(sc, out=out, pacing=pacing, steps=steps, world=world, seed=seed,
                                  backend=backend, prefix=prefix, progress=progress, deadline_s=deadline_s)
        finally:
            if down_after and backend == "lab":
                claim.close()  # (the lab down, then the claim released)
                if not state.state_path(prefix).exists():
                    state.remove(prefix)  # the claim's lock file, now that nobody holds it
    return result


def _down_after(prefix: str) -> None:
    """Take down the lab a study point built, after its run however it ended. It runs after the run's
    own signal handling: Ctrl-C is waited out here (cut short, it left a half-removed lab under a
    prefix the user never saw), and a failure is one warning naming the command that finishes it,
    never an error that would replace the run's own (the review of audit 16 saw both)."""
    try:
        with _signals_wait():
            fabric.down(prefix)
    except LabError as exc:
        print(f"warning: lab {prefix} was not fully taken down after the run ({exc}); run "
              f"`fabricpace lab down --prefix {prefix}`", file=sys.stderr, flush=True)


def _run_claimed(sc: Scenario, *, out: Path, pacing: str, steps: int, world: int, seed: int, backend: str,
                 prefix: str, progress: bool, deadline_s: float | None) -> dict[str, Any]:
    cfg: LabConfig | None = None
    if backend == "lab":
        if sc.fabric.leaves > world:
            print(f"warning: scenario {sc.name}: fabric.leaves {sc.fabric.leaves} with {world} ranks: "
                  f"the lab uses {world} leaves (one node each); lab.json's topology has the lab as built",
                  file=sys.stderr, flush=True)
        cfg = LabConfig(nodes=world, leaves=min(sc.fabric.leaves, world), prefix=prefix,
                        uplink_bps=parse_rate(sc.fabric.uplink),
                        node_link_bps=parse_rate(sc.fabric.node_link))
        rank_node = mirror.resolve(sc.placement, cfg, world, source=f"scenario {sc.name}")
        # A second run in the same lab would share its namespaces and rendezvous port (or, with another
        # shape, rebuild the lab under the first run's ranks): refuse before anything is written. (The
        # run claim covers runs started at the same instant; this covers ranks a crashed launcher left.)
        fabric.refuse_if_busy(prefix, "starting another run in it")
    else:
        rank_node = list(range(world))
        prefix = LOCAL_PREFIX
    check_memory(world)
    created = _first_missing(out)
    scratch = _prepare_out(out)
    run = _Run()
    with _stop_signals_interrupt():
        try:
            if cfg is not None:
                fabric.up(cfg)
            t0 = time.time()
            _run_ranks(sc, run, out=out, cfg=cfg, world=world, steps=steps, pacing=pacing, seed=seed,
                       prefix=prefix, rank_node=rank_node, progress=progress, deadline_s=deadline_s)
        except BaseException as exc:
            # An interrupt or a failed run leaves nothing: the half-written run directory would block
            # the same --out next time. Only a run whose ranks failed keeps their logs (the error
            # names them).
            keep_logs = isinstance(exc, LabError) and bool(run.procs)
            with _signals_wait(keep=True):
                _discard(out, scratch, created, keep_logs=keep_logs)
            raise
    annotate(out, sc, backend=backend, world=world, rank_node=rank_node, cfg=cfg, events=run.events,
             throttled_ns=run.throttled_ns, pacing=pacing, seed=seed, scratch=scratch_dir(out))
    res = {"scenario": sc.name, "backend": backend, "world": world, "steps": steps, "pacing": pacing,
           "run_dir": str(out), "seconds": round(time.time() - t0, 1), "rank_node": rank_node}
    if cfg is not None:
        res |= {"cluster_file": str(out / mirror.CLUSTER_FILE) if (out / mirror.CLUSTER_FILE).is_file()
                else None, "hosts_file": str(out / mirror.HOSTS_FILE)}
    return res


@contextlib.contextmanager
def _handling(sigs: tuple[signal.Signals, ...], handler: Callable[[int, object], None], *,
              linger_s: float = 0.0) -> Iterator[None]:
    """``handler`` for ``sigs`` inside the block (main thread only; a signal set to be ignored, as
    under nohup, stays ignored: that user wants the run to outlive the terminal).

    With ``linger_s``, when the block ends by an interrupt, the same signals that arrive within
    ``linger_s`` seconds after it are still waited out: they are the rest of the user's burst of
    Ctrl-C, and the command is on its way out (exit 130). Without that, one landing just after the
    clean-up killed the process with a traceback (exit -2 instead of 130)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = [sig for sig in sigs if signal.getsignal(sig) is not signal.SIG_IGN]
    previous = {sig: signal.signal(sig, handler) for sig in kept}
    interrupted = False
    try:
        yield
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        for sig, old in previous.items():
            signal.signal(sig, _lingering(old, linger_s) if interrupted and linger_s > 0 else old)
        if interrupted and linger_s > 0 and previous:
            # Python puts the default handlers back while it exits: ignore them then, while they last.
            _exit_linger(previous, time.monotonic() + linger_s)


class _ExitLinger:
    """The signals to ignore while the interpreter exits, and until when. One atexit hook serves every
    interrupted run of the process: a long-lived program that runs the launcher many times used to pile
    up one hook per interrupted run (only the latest run's deadline matters: the others have passed)."""

    def __init__(self) -> None:
        self.sigs: set[signal.Signals] = set()
        self.until = 0.0
        self.registered = False

    def run(self) -> None:
        if time.monotonic() < self.until and threading.current_thread() is threading.main_thread():
            for sig in sorted(self.sigs):
                signal.signal(sig, signal.SIG_IGN)


_EXIT_LINGER = _ExitLinger()


def _exit_linger(sigs: Iterable[signal.Signals], until: float) -> None:
    if time.monotonic() >= _EXIT_LINGER.until:
        _EXIT_LINGER.sigs.clear()  # an earlier run's linger is over: only this run's signals now
    _EXIT_LINGER.sigs.update(sigs)
    _EXIT_LINGER.until = max(_EXIT_LINGER.until, until)
    if not _EXIT_LINGER.registered:
        atexit.register(_EXIT_LINGER.run)
        _EXIT_LINGER.registered = True


def _lingering(previous: Any, seconds: float) -> Callable[[int, object], None]:
    """A handler that ignores its signal for ``seconds``, then puts ``previous`` back and acts as it."""
    until = time.monotonic() + seconds

    def handler(signum: int, frame: object) -> None:
        if time.monotonic() < until:
            return
        signal.signal(signum, previous)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            os.kill(os.getpid(), signum)

    return handler


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
LINGER_S = 3.0  # after an interrupted run, more of the same signals are waited out this long


class _Interrupts:
    """What Ctrl-C (SIGINT), ``kill`` (SIGTERM) and a closed terminal (SIGHUP) do during a run.

    The first one interrupts the run (KeyboardInterrupt: the clean-up path). Once the clean-up has
    begun, for that or any other reason, later ones are noted and waited out: a Ctrl-C pressed again
    and again used to land in the gaps between clean-up steps (between ending the ranks and removing
    the run directory) and cut the rest short."""

    def __init__(self) -> None:
        self.cleaning = False
        self.told = False

    def handler(self, signum: int, frame: object) -> None:
        if not self.cleaning:
            self.cleaning = True
            sig = signal.Signals(signum)
            raise KeyboardInterrupt() if sig == signal.SIGINT else KeyboardInterrupt(sig.name)
        if not self.told:
            self.told = True
            print("fabricpace: cleaning up the lab run (ending its ranks, restoring the lab); "
                  "this takes a few seconds", file=sys.stderr, flush=True)


_INTERRUPTS = _Interrupts()


def _stop_signals_interrupt() -> contextlib.AbstractContextManager[None]:
    """SIGINT, SIGTERM and SIGHUP (Ctrl-C, ``kill``, ``timeout``, a closed terminal) end the run the
    same way, through one handler for the whole run.

    Python's default for SIGTERM and SIGHUP is to die at once: the ranks trained on as orphans, the
    throttled rank's cgroup and the half-written run directory stayed. As KeyboardInterrupt they take
    the same cleanup path as Ctrl-C."""
    global _INTERRUPTS
    _INTERRUPTS = _Interrupts()
    return _handling(_SIGNALS, _INTERRUPTS.handler, linger_s=LINGER_S)


@contextlib.contextmanager
def _signals_wait(*, keep: bool = False) -> Iterator[None]:
    """A second Ctrl-C (or SIGTERM, SIGHUP) while the run cleans up is noted and waited out.

    The clean-up ends the ranks (at most ~5 s), removes the throttle cgroup, restores the lab's shaping
    and the half-written run directory; cut short, it left ranks, a cgroup or folders behind. What it
    waits for is bounded, so the user waits seconds, not forever. With ``keep`` (or when the block
    raises) later signals stay waited out after the block too: more clean-up follows."""
    ints = _INTERRUPTS
    was = ints.cleaning
    ints.cleaning = True
    with _handling(_SIGNALS, ints.handler):
        yield
    if not keep:
        ints.cleaning = was


def _first_missing(out: Path) -> Path | None:
    """The topmost folder of ``out``'s path that does not exist yet (what a failed run removes)."""
    missing = None
    for p in [out, *out.parents]:
        if p.exists() or p.is_symlink():
            break
        missing = p
    return missing


def _discard(out: Path, scratch: Path, created: Path | None, *, keep_logs: bool) -> None:
    """Undo ``_prepare_out`` and what the ranks wrote: ``out`` was absent or empty before the run."""
    if out.is_dir() and not out.is_symlink():
        if created is not None and (out == created or created in out.parents):
            shutil.rmtree(out, ignore_errors=True)
        else:  # the user's own empty folder stays, empty
            for child in list(out.iterdir()):
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
    if not keep_logs:
        shutil.rmtree(scratch, ignore_errors=True)
    if created is not None and created != out:
        for folder in [out.parent, *out.parent.parents]:  # parents the run made, when empty again
            with contextlib.suppress(OSError):
                folder.rmdir()
            if folder == created:
                break


def _run_ranks(sc: Scenario, run: _Run, *, out: Path, cfg: LabConfig | None, world: int, steps: int,
               pacing: str, seed: int, prefix: str, rank_node: list[int], progress: bool,
               deadline_s: float | None) -> None:
    """Start the ranks, apply the faults, wait for them; always end them and restore the lab."""
    deadline = deadline_s or 90.0 + 1.5 * steps
    th = sc.faults.throttle
    use_cgroup = th is not None and os.geteuid() == 0 and cgroup.available()
    slow = None
    if th is not None and not use_cgroup:
        # No cgroups (not root): the same straggler, made by extra compute instead of a CPU quota.
        slow = (",".join(str(r) for r in th.ranks), 4.0)
    args = worker_args(sc, run_dir=out, steps=steps, pacing=pacing, seed=seed, slow=slow)
    def restore() -> None:
        _cleanup(run, cfg, prefix)
        if cfg is not None and sc.faults.uplink_change is not None:
            fabric.set_uplink_rate(cfg, cfg.uplink_bps)  # the lab stays as `lab up` made it

    try:
        _spawn_workers(sc, run, world=world, out=out, args=args, cfg=cfg, rank_node=rank_node)
        throttle = (lambda: _throttle(run, th.ranks, th.cpus, prefix, world)) if th and use_cgroup else None
        _wait(run, sc, out=out, steps=steps, deadline_s=deadline, cfg=cfg, progress=progress,
              on_start=throttle)
    except BaseException:
        with _signals_wait(keep=True):  # the run directory's removal follows (run_scenario)
            restore()
        raise
    with _signals_wait():
        restore()
    if not (out / "manifest.json").is_file():
        raise LabError(f"scenario {sc.name}: the ranks finished but wrote no run directory at {out}; "
                       f"logs in {scratch_dir(out)}")
