"""One rank of the 4-rank gloo job the observer tests share (launched as a plain subprocess).

It runs three observer sessions in one process group, so the spawn cost is paid once:

A. gradients: a plain DDP model and an observed DDP model with the same weights and data; every
   step's gradients are compared bitwise. A test-double pacer records the hook calls it receives;
   torch.distributed.all_reduce is wrapped and a manual ``obs.collective`` is recorded.
B. straggler + clock: rank SLOW sleeps in every step; rank 2's clock is shifted by
   FABRICPACE_CLOCK_SHIFT_NS (set by the test); a pacer that raises inside the comm hook is dropped;
   rank 0 serves Prometheus metrics and fetches them.
C. read-only run directory (made immutable by the test): training must finish.
D. a peer gone: rank 3 closes its observer early (it keeps training); the others' next window
   gather times out after gather_timeout_s, is logged once, and training goes on.
E. hook-free DDP instrumentation (the default without pacing): rank SLOW sleeps in every step; a
   plain DDP replica runs the same data after the observed one, gradients compared bitwise.
F. lazy comm hook: a pacer double that asks for bucket calls after its second window; the hook is
   installed mid-run; gradients compared bitwise with a plain replica before and after.

Each rank writes what it saw to OUT/rank-R.json; the tests read the JSON and the run directories.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import fabricpace
from fabricpace.observe import ObserverConfig

SLOW = 3


class TinyPacer:
    """Test double of the pacer protocol: records calls, injects a fixed 'delay' figure."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.windows: list[tuple[int, int]] = []

    def _hit(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def on_step_start(self, step: int) -> None:
        self._hit("on_step_start")

    def on_step_end(self, step: int) -> int:
        self._hit("on_step_end")
        return 1234

    def before_bucket(self, bucket_index: int) -> None:
        self._hit("before_bucket")

    def after_bucket(self, bucket_index: int) -> None:
        self._hit("after_bucket")

    def on_window(self, step: int, summaries: list) -> None:
        self._hit("on_window")
        self.windows.append((step, len(summaries)))

    def batch_share(self, global_batch: int) -> int:
        self._hit("batch_share")
        return global_batch // 4

    def status(self) -> str:
        return "tiny pacer"

    def close(self) -> None:
        self._hit("close")


class BrokenPacer(TinyPacer):
    """Raises inside the comm hook (autograd thread) at its third bucket."""

    def before_bucket(self, bucket_index: int) -> None:
        super().before_bucket(bucket_index)
        if self.calls["before_bucket"] == 3:
            raise RuntimeError("pacer bug")


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.Tanh(), torch.nn.Linear(128, 128), torch.nn.Tanh(),
        torch.nn.Linear(128, 10),
    )


def session_a(rank: int, out: Path, result: dict) -> None:
    plain = DDP(model(), bucket_cap_mb=0.02)
    seen = DDP(model(), bucket_cap_mb=0.02)
    pacer = TinyPacer()
    cfg = ObserverConfig(flush_mode="main", flush_every=4, flush_interval_s=0, status_line=False)
    gen = torch.Generator().manual_seed(10 + rank)
    equal = []
    with fabricpace.observe(seen, run_dir=out / "a", pacing=pacer, window=5, config=cfg,
                            wrap_collectives=True) as obs:
        for _ in range(10):
            x = torch.randn(16, 32, generator=gen)
            with obs.step(samples=obs.batch_share(64)):
                plain.zero_grad()
                seen.zero_grad()
                plain(x).square().sum().backward()
                seen(x).square().sum().backward()
                dist.all_reduce(torch.ones(4))
                with obs.collective("manual_op", 16):
                    time.sleep(0.001)
            grads = [(p.grad, q.grad) for p, q in zip(plain.parameters(), seen.parameters(), strict=True)]
            equal.append(all(torch.equal(a, b) for a, b in grads))
            with torch.no_grad():
                for p, q in zip(plain.parameters(), seen.parameters(), strict=True):
                    p -= 0.01 * p.grad
                    q -= 0.01 * q.grad
    result["a"] = {"equal": equal, "calls": pacer.calls, "windows": pacer.windows,
                   "failures": obs.failures}


def session_b(rank: int, out: Path, result: dict, port: int) -> None:
    m = DDP(model(1), bucket_cap_mb=0.02)
    pacer = BrokenPacer()
    # clock_every=10: the offset is re-estimated in the background twice during training.
    cfg = ObserverConfig(status_line=False, flush_every=10, flush_interval_s=0, clock_every=10)
    gen = torch.Generator().manual_seed(20 + rank)
    metrics = ""
    with fabricpace.observe(m, run_dir=out / "b", pacing=pacer, window=10, config=cfg,
                            metrics_port=port if rank == 0 else None) as obs:
        for i in range(30):
            x = torch.randn(16, 32, generator=gen)
            with obs.step(samples=16):
                if rank == SLOW:
                    time.sleep(0.03)
                m.zero_grad()
                m(x).square().sum().backward()
            if rank == 0 and i == 20:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                    metrics = resp.read().decode()
    est = obs.clock_estimate
    result["b"] = {
        "offset_ns": est.offset_ns,
        "clock_updates": obs.clock_updates,
        "err_ns": est.err_ns,
        "failures": obs.failures,
        "pacer_calls": pacer.calls,
        "windows": [[vars(s) for s in w] for w in obs.window_history],
        "metrics": metrics,
    }


def session_c(rank: int, out: Path, result: dict) -> None:
    m = DDP(model(2))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(30 + rank)
    losses = []
    cfg = ObserverConfig(status_line=False, flush_every=3, flush_interval_s=0)
    with fabricpace.observe(m, run_dir=out / "readonly", window=5, config=cfg) as obs:
        for _ in range(12):
            with obs.step(samples=8):
                loss = m(torch.randn(8, 32, generator=gen)).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            losses.append(float(loss))
    result["c"] = {"losses": losses, "failures": obs.failures, "windows": len(obs.window_history)}


def session_d(rank: int, out: Path, result: dict) -> None:
    m = DDP(model(3))
    gen = torch.Generator().manual_seed(40 + rank)
    cfg = ObserverConfig(status_line=False, gather_timeout_s=2.0, close_timeout_s=2.0)
    t0 = time.perf_counter()
    obs = fabricpace.observe(m, run_dir=out / "gone", window=5, config=cfg)
    for i in range(14):
        if rank == 3 and i == 3:
            obs.close()  # this rank's observer is gone; its training continues
        with obs.step(samples=8):
            m(torch.randn(8, 32, generator=gen)).sum().backward()
    obs.close()
    result["d"] = {"failures": obs.failures, "windows": len(obs.window_history),
                   "seconds": time.perf_counter() - t0}


class LatePacer(TinyPacer):
    """Says it wants the comm hook from its second window on (the same step on every rank)."""

    def wants_comm_hook(self) -> bool:
        self._hit("wants_comm_hook")
        return len(self.windows) >= 2


def _compare_and_step(plain: DDP, seen: DDP) -> bool:
    pairs = list(zip(plain.parameters(), seen.parameters(), strict=True))
    equal = all(torch.equal(p.grad, q.grad) for p, q in pairs)
    with torch.no_grad():
        for p, q in pairs:
            p -= 0.01 * p.grad
            q -= 0.01 * q.grad
    return equal


def session_e(rank: int, out: Path, result: dict) -> None:
    seen = DDP(model(5), bucket_cap_mb=0.02)
    plain = DDP(model(5), bucket_cap_mb=0.02)
    cfg = ObserverConfig(status_line=False, flush_every=10, flush_interval_s=0)
    gen = torch.Generator().manual_seed(50 + rank)
    equal = []
    with fabricpace.observe(seen, run_dir=out / "e", window=10, config=cfg) as obs:
        for _ in range(24):
            x = torch.randn(16, 32, generator=gen)
            with obs.step(samples=16):
                if rank == SLOW:
                    time.sleep(0.03)
                seen.zero_grad()
                seen(x).square().sum().backward()  # observed first: its all-reduce sees the straggler
                plain.zero_grad()
                plain(x).square().sum().backward()
            equal.append(_compare_and_step(plain, seen))
        probe = obs._probe
        kept = None if probe is None else [len(probe.kept), len(probe.buckets), len(probe._handles)]
    result["e"] = {"equal": equal, "mode": obs.ddp_mode, "failures": obs.failures, "kept": kept,
                   "windows": [[vars(s) for s in w] for w in obs.window_history]}


def session_f(rank: int, out: Path, result: dict) -> None:
    seen = DDP(model(6), bucket_cap_mb=0.02)
    plain = DDP(model(6), bucket_cap_mb=0.02)
    pacer = LatePacer()
    cfg = ObserverConfig(status_line=False, flush_every=5, flush_interval_s=0, gather_lag_steps=0)
    gen = torch.Generator().manual_seed(60 + rank)
    equal, modes, buckets = [], [], []
    with fabricpace.observe(seen, run_dir=out / "f", pacing=pacer, window=4, config=cfg) as obs:
        for _ in range(14):
            x = torch.randn(16, 32, generator=gen)
            before = pacer.calls.get("before_bucket", 0)
            with obs.step(samples=16):
                seen.zero_grad()
                seen(x).square().sum().backward()
                plain.zero_grad()
                plain(x).square().sum().backward()
            buckets.append(pacer.calls.get("before_bucket", 0) - before)
            modes.append(obs.ddp_mode)
            equal.append(_compare_and_step(plain, seen))
    result["f"] = {"equal": equal, "modes": modes, "bucket_calls": buckets, "hook_step": obs.comm_hook_step,
                   "failures": obs.failures, "calls": pacer.calls}


def main() -> None:
    out = Path(sys.argv[1])
    port = int(sys.argv[2])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result: dict = {"rank": rank}
    session_a(rank, out, result)
    session_b(rank, out, result, port)
    session_c(rank, out, result)
    session_e(rank, out, result)
    session_f(rank, out, result)
    session_d(rank, out, result)  # last: it leaves a timed-out gather behind on ranks 0-2
    (out / f"rank-{rank}.json").write_text(json.dumps(result, default=str))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()
    # Results are written and flushed. Skip interpreter teardown: torch's C++ static destructors can
    # abort ("terminate called without an active exception") while a gloo thread winds down,
    # which would turn a finished rank into a failed one (same as fabricpace.lab.worker).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
