"""One rank of a small observed DDP job into which a fault is injected (tests/observe/test_faults.py).

    _fault_worker.py OUT FAULT [--observe/--no-observe] [--rank R] [--step K] [--steps N] ...

FAULT is what rank R does at step K:
  none   nothing (a healthy run)
  kill   SIGKILL itself (a crashed node)
  raise  raise ``UserBoom`` inside ``obs.step()`` (the user's own error; the others block in the
         next all-reduce until this process is gone)
  raise-before  the same, but between steps (outside ``obs.step()``)
  sigterm  SIGTERM itself (torchrun's way of stopping the other workers when one failed)
  ro     fill the disk the run directory is on (a small tmpfs, see the test): later writes fail
  mark   only write OUT/fault.json (the test acts on it, e.g. freezes the Store's process)
  interrupt  raise KeyboardInterrupt inside ``obs.step()``
  stop   SIGSTOP itself (a frozen node: the others wait for the job's own collective timeout)

Every rank appends one JSON line to OUT/rank-R.json when it leaves main(): how it ended (ok, or the
exception's type and text), wall seconds since the fault (the faulty rank writes OUT/fault.json
with its wall time just before the fault), and the observer's failures. The exit status is 0 when
training finished, 3 when the user's own error (or a torch collective error) ended it.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import fabricpace
from fabricpace.observe import ObserverConfig


class UserBoom(RuntimeError):
    """The user's own error, raised inside the training loop."""


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("fault")
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--step", type=int, default=7)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--pacing", default="off")
    p.add_argument("--no-observe", action="store_true")
    p.add_argument("--run-dir", default=None)
    p.add_argument("--user-timeout", type=float, default=60.0, help="the job's own collective timeout")
    p.add_argument("--store-timeout", type=float, default=3.0)
    p.add_argument("--gather-timeout", type=float, default=3.0)
    p.add_argument("--close-timeout", type=float, default=3.0)
    p.add_argument("--clock-every", type=int, default=0)
    p.add_argument("--attempt", type=int, default=None,
                   help="fault only in this torchrun attempt (TORCHELASTIC_RESTART_COUNT)")
    p.add_argument("--store-prefix", default=None,
                   help="init the process group on PrefixStore(PREFIX, TCPStore client of MASTER_ADDR:PORT)")
    p.add_argument("--slow-rank0-dir", action="store_true",
                   help="rank 0 takes 1 s to pick a fresh run directory (as on a slow shared file system)")
    p.add_argument("--pacer-timeout-rank", type=int, default=None,
                   help="this rank's pacer gets a 0 s controller time limit (it turns itself off)")
    p.add_argument("--pin-gc-rank", type=int, default=None,
                   help="every rank pins lockstep GC every 5 steps, this rank every 7 (states differ)")
    p.add_argument("--sleep-ms", type=float, default=0.0, help="sleep per step (slows the job down)")
    p.add_argument("--batch-share", action="store_true",
                   help="the loop asks obs.batch_share(16) every step (so rebalance stays in the policies)")
    p.add_argument("--late-rank", type=int, default=None, help="this rank sleeps --late-s before observe()")
    p.add_argument("--late-s", type=float, default=0.0)
    p.add_argument("--skip-rank", type=int, default=None, help="this rank trains without observe()")
    p.add_argument("--rank-window", default=None,
                   help="R:W[:LAG] — rank R passes window=W (and gather_lag_steps=LAG) instead")
    p.add_argument("--flush-interval", type=float, default=0.0)
    p.add_argument("--flush-every", type=int, default=2)
    p.add_argument("--step-log", action="store_true", help="record each step's wall seconds in the JSON")
    return p.parse_args()


def main() -> int:
    a = parse()
    out = Path(a.out)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the driver's "where are you stuck?"
    torch.set_num_threads(1)
    timeout = timedelta(seconds=a.user_timeout)
    if a.store_prefix:  # a job that keeps one Store server across attempts, one prefix per attempt
        client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                               timeout=timeout, wait_for_workers=False)
        dist.init_process_group("gloo", store=dist.PrefixStore(a.store_prefix, client), timeout=timeout,
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    else:
        dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    window, lag = a.window, 2
    if a.rank_window is not None and int(a.rank_window.split(":")[0]) == rank:
        parts = [int(v) for v in a.rank_window.split(":")]
        window, lag = parts[1], parts[2] if len(parts) > 2 else lag
    cfg = ObserverConfig(status_line=False, window=window, gather_lag_steps=lag, flush_every=a.flush_every,
                         flush_interval_s=a.flush_interval, store_timeout_s=a.store_timeout,
                         gather_timeout_s=a.gather_timeout, close_timeout_s=a.close_timeout,
                         clock_every=a.clock_every, clock_rounds=3)
    if a.skip_rank == rank:
        a.no_observe = True
    result: dict = {"rank": rank, "pid": os.getpid(), "restart": os.environ.get("TORCHELASTIC_RESTART_COUNT")}
    if a.slow_rank0_dir and rank == 0:
        logging.getLogger("fabricpace.observe").addHandler(_SlowDirHandler())
    obs = None
    code = 0
    try:
        pacing: object = a.pacing
        if a.pacer_timeout_rank is not None:
            from fabricpace.pacing import PacingConfig, make_pacer

            limit = 0.0 if rank == a.pacer_timeout_rank else 2.0
            pacing = make_pacer(a.pacing, rank=rank, world_size=dist.get_world_size(), run_dir=None,
                                window=a.window, config=PacingConfig(controller_timeout_s=limit))
        if a.pin_gc_rank is not None:
            from fabricpace.pacing import make_pacer
            from fabricpace.pacing.state import PacingState

            pacing = make_pacer("gc", rank=rank, world_size=dist.get_world_size(), run_dir=None,
                                window=a.window)
            pacing.pin(PacingState(gc_interval=7 if rank == a.pin_gc_rank else 5))
        if a.late_rank == rank:
            time.sleep(a.late_s)
        t_obs = time.monotonic()
        obs = None if a.no_observe else fabricpace.observe(model, run_dir=a.run_dir or out / "run",
                                                           pacing=pacing, config=cfg)
        result["observe_s"] = time.monotonic() - t_obs
        result["run_dir"] = None if obs is None else str(obs.run_dir)
        result["window"] = None if obs is None else [obs.config.window, obs.config.gather_lag_steps]
        steps_s: list[float] = []
        result["steps_s"] = steps_s
        t_train = time.monotonic()
        with obs if obs is not None else _Null():
            for i in range(a.steps):
                mine = rank == a.rank and i == a.step and (
                    a.attempt is None or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == str(a.attempt))
                if mine and a.fault == "raise-before":
                    _mark(out)
                    raise UserBoom(f"user error on rank {rank} at step {i}")
                if a.batch_share and obs is not None:
                    obs.batch_share(16)
                t_step = time.monotonic()
                with obs.step(samples=8) if obs is not None else _Null():
                    if mine:
                        _fault(a.fault, out, obs)
                    if a.sleep_ms:
                        time.sleep(a.sleep_ms / 1e3)
                    loss = model(torch.randn(8, 16, generator=gen)).square().mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                if a.step_log:
                    steps_s.append(round(time.monotonic() - t_step, 4))
                if obs is not None and "pacer_off_step" not in result and not obs.pacer.active:
                    result["pacer_off_step"] = i
        result["end"] = "ok"
        result["train_s"] = time.monotonic() - t_train
    except BaseException as exc:  # record how the rank ended, then exit non-zero
        result["end"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        code = 3
    result["wall"] = time.time()
    result["failures"] = None if obs is None else obs.failures
    with open(out / f"rank-{rank}.json", "a") as f:
        f.write(json.dumps(result) + "\n")
    return code


class _SlowDirHandler(logging.Handler):
    """Sleeps when the observer reports that it moves to ``run_dir-N`` (after listing the old one)."""

    def emit(self, record: logging.LogRecord) -> None:
        if "is not empty" in record.getMessage():
            time.sleep(1.0)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _mark(out: Path) -> None:
    (out / "fault.json").write_text(json.dumps({"wall": time.time()}))


def _fault(fault: str, out: Path, obs: object) -> None:
    if fault == "none":
        return
    if fault == "mark":  # the driver acts on the fault marker (e.g. kills the Store's process)
        _mark(out)
        return
    if fault == "ro":
        run = Path(obs.run_dir)  # type: ignore[attr-defined]
        fill = run / "fill.bin"
        # Fill the (small tmpfs) disk: every later write fails with ENOSPC.
        with open(fill, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 16))
                    f.flush()
            except OSError:
                pass
        _mark(out)
        return
    _mark(out)
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "stop":  # frozen (SIGSTOP), not dead: the peers wait in the user's collective
        os.kill(os.getpid(), signal.SIGSTOP)
    if fault == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    if fault == "interrupt":
        raise KeyboardInterrupt
    raise UserBoom(f"user error on rank {dist.get_rank()}")


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown (torch's gloo teardown can abort a finished rank, see _gloo_worker).
    os._exit(rc)
