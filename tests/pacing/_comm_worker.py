"""One rank of a real gloo job for the comm-policy tests (launched as a plain subprocess).

The job trains an observed DDP model with the real pacer (``pacing="auto"``'s policies) and a plain
DDP replica on the same data; every step's gradients are compared bitwise. What makes comm fire is
injected where the controller reads it: the pacer below is the real ``Pacer`` whose window summaries
report transfer inflated 3x from window ``inflate_from`` on (a fabric that became contended, what the
comm trigger looks for) and 9x from window ``reinflate_at`` on (contention growing again: a second
trial), and, so that the guard's verdict does not hang on this shared host's noise,
steady step times — 13 ms in the windows that ran with comm gating, 10 ms in the others (gating hurts:
the trial must be reverted). Everything else is real: the observer, its DDP instrumentation, the comm
hook installed and removed, gloo, the run directory.

argv: OUT CONFIG_JSON. Each rank writes OUT/rank-R.json.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import fabricpace
import fabricpace.pacing.pacer as pacer_mod
from fabricpace.observe import ObserverConfig

MS = 1e6


class InjectedPacer(pacer_mod.Pacer):
    """The real pacer; its windows are rewritten as the module docstring says before it reads them."""

    inflate_from = 5
    reinflate_at = 1 << 30

    def on_window(self, step, summaries):  # type: ignore[no-untyped-def]
        gated = self.state.comm_window is not None  # the state the closed window ran under
        step_ns = (13.0 if gated else 10.0) * MS
        w = summaries[0].window if summaries else 0
        quiet = (1.0, 1.05, 0.95)[w % 3] * MS
        transfer = quiet * (9.0 if w >= self.reinflate_at else 3.0 if w >= self.inflate_from else 1.0)
        half = max(s.collectives for s in summaries) / len(summaries)
        rows = [replace(s, step_mean_ns=step_ns, step_median_ns=step_ns, step_std_ns=0.1 * MS,
                        compute_median_ns=6.0 * MS, compute_per_sample_ns=6.0 * MS / 8,
                        tail_compute_median_ns=6.0 * MS, tail_samples_mean=8.0, samples_mean=8.0,
                        wait_mean_ns=3.0 * MS, comm_mean_ns=3.0 * MS, transfer_mean_ns=transfer,
                        gc_mean_ns=0.0, gc_count=0.0, last_arrivals=half, paced_mean_ns=0.0)
                for s in summaries]
        super().on_window(step, rows)


def model(kind: str, **ddp) -> DDP:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    if kind == "one":  # a single bucket
        return DDP(torch.nn.Linear(8, 8), **ddp)
    net = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(4)])
    return DDP(net, bucket_cap_mb=0.004, **ddp)  # 4 buckets


def main() -> None:
    out, cfg = Path(sys.argv[1]), json.loads(sys.argv[2])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # The observed model's gradients are views into DDP's buckets (the riskier case for a rebuilt
    # reducer: its new buckets must take the gradients over); static_graph=True cannot be rebuilt.
    seen = model(cfg["model"], gradient_as_bucket_view=True, static_graph=bool(cfg.get("static")))
    plain = model(cfg["model"])
    InjectedPacer.inflate_from = int(cfg.get("inflate_from", 5))
    InjectedPacer.reinflate_at = int(cfg.get("reinflate_at", 1 << 30))
    kw = {}
    if hasattr(pacer_mod, "hosts_from_env"):  # (the same worker runs on the code before the fix)
        kw["hosts"] = pacer_mod.hosts_from_env(world)
    pacer = InjectedPacer(cfg.get("policies", "auto"), rank=rank, world_size=world, run_dir=out / "run",
                          window=cfg["window"], **kw)
    conf = ObserverConfig(status_line=False, gather_lag_steps=0, flush_every=10, flush_interval_s=0)
    gen = torch.Generator().manual_seed(7 + rank)
    equal, modes, hooks, reducers = [], [], [], []
    obs = fabricpace.observe(seen, run_dir=out / "run", pacing=pacer, window=cfg["window"], config=conf)
    with obs:
        for _ in range(cfg["steps"]):
            x = torch.randn(8, 8 if cfg["model"] == "one" else 32, generator=gen)
            with obs.step(samples=8):
                seen.zero_grad()
                seen(x).square().sum().backward()
            plain.zero_grad()
            plain(x).square().sum().backward()
            pairs = list(zip(plain.parameters(), seen.parameters(), strict=True))
            equal.append(all(torch.equal(p.grad, q.grad) for p, q in pairs))
            with torch.no_grad():
                for p, q in pairs:
                    p -= 0.01 * p.grad
                    q -= 0.01 * q.grad
            modes.append(obs.ddp_mode)
            hooks.append(len(getattr(seen, "_comm_hooks", [])))
            reducers.append(id(seen.reducer))
        buckets = getattr(pacer.controller, "comm_buckets", None)
    result = {"equal": equal, "modes": modes, "hooks": hooks, "reducers": len(set(reducers)),
              "failures": obs.failures, "policies": list(pacer.policies), "buckets": buckets,
              "decisions": [[d.step, d.policy, d.action, d.reason] for d in pacer.decisions],
              "logged_hook": seen._get_ddp_logging_data().get("comm_hook", "")}
    (out / f"rank-{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Results are written. torch 2.13's gloo teardown can still abort a finished rank at interpreter exit
    # ("terminate called without an active exception"; examples/ddp_train.py): skip interpreter teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
