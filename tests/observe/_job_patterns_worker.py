"""One rank of a real gloo job written the way users write training loops, with or without the observer.

    python _job_patterns_worker.py OUT PATTERN [--observe] [--pacing off|auto|gc] [--steps N] [--window W]

Launched as env:// ranks (torchrun or ``tests/observe/conftest.launch_ranks``). Each pattern is a loop
a real job uses (validation between steps, gradient accumulation with ``no_sync``, torch.compile,
FSDP2, DDP ``Join`` for uneven inputs, ...). The same data (seeded per rank) and the same initial
weights run with and without ``--observe``; each rank writes OUT/rank-R.json with a digest of its
final parameters (so a test can compare them bitwise), the optimizer steps it took, the wall time
of its loop, and what the observer said about itself (failures, DDP mode, run directory).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

PATTERNS: dict[str, Callable[[Any], None]] = {}


def pattern(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    PATTERNS[fn.__name__.removeprefix("p_")] = fn
    return fn


def net(seed: int = 0, width: int = 64) -> torch.nn.Sequential:
    torch.manual_seed(seed)  # the same initial weights on every rank and in every variant
    return torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, 10))


class NoObserver:
    """The observer's loop API doing nothing: the same script runs unobserved."""

    run_dir = None
    ddp_mode = None

    def __init__(self) -> None:
        self.failures: dict[str, str] = {}

    def step(self, samples: int = 0) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def phase(self, name: str) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def batch_share(self, global_batch: int) -> int:
        return global_batch // dist.get_world_size()

    def close(self) -> None:
        pass

    def __enter__(self) -> NoObserver:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class Job:
    """What a pattern needs: rank, data, a way to start an observer (or not), and its results."""

    def __init__(self, args: argparse.Namespace, out: Path | None = None) -> None:
        self.args = args
        self.out = Path(out or args.out)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.gen = torch.Generator().manual_seed(1000 + self.rank)
        self.steps_taken = 0  # optimizer steps actually applied
        self.observers: list[Any] = []
        self.models: list[torch.nn.Module] = []
        self.notes: dict[str, Any] = {}
        self.sessions = 0

    def batch(self, n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, 32, generator=self.gen), torch.randint(0, 10, (n,), generator=self.gen)

    def observe(self, model: Any, *, pacing: str | None = None, **kw: Any) -> Any:
        """The observer (``--observe``) or a stand-in; ``pacing`` overrides ``--pacing``."""
        if not self.args.observe:
            return NoObserver()
        from fabricpace.observe import ObserverConfig, observe

        self.sessions += 1
        cfg = ObserverConfig(flush_every=self.args.window, flush_interval_s=0, status_line=False,
                             gather_timeout_s=self.args.gather_timeout, close_timeout_s=10,
                             store_timeout_s=20)
        run_dir = self.out / ("run" if self.sessions == 1 else f"run{self.sessions}")
        obs = observe(model, run_dir=run_dir, pacing=pacing or self.args.pacing, window=self.args.window,
                      config=cfg, **kw)
        self.observers.append(obs)
        return obs

    def train_step(self, model: Any, opt: Any, n: int = 16, *, scale: float = 1.0) -> torch.Tensor:
        x, y = self.batch(n)
        loss = F.cross_entropy(model(x), y) * scale
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        self.steps_taken += 1
        return loss


def ddp(**kw: Any) -> tuple[DDP, torch.optim.Optimizer]:
    kw.setdefault("bucket_cap_mb", 0.01)  # a few buckets for this small model
    model = DDP(net(), **kw)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def simple_loop(job: Job, model: Any, opt: Any, **obs_kw: Any) -> None:
    job.models.append(model)
    with job.observe(model, **obs_kw) as obs:
        for _ in range(job.args.steps):
            with obs.step(samples=16):
                job.train_step(model, opt)


@pattern
def p_base(job: Job) -> None:
    simple_loop(job, *ddp())


@pattern
def p_gc_churn(job: Job) -> None:
    """Python garbage with reference cycles every step (a data pipeline's objects): the collector
    pauses at random steps, which pacing "gc" (always, whatever ``--pacing`` says) turns into
    lockstep collections. At least 30 steps, so the pacer sees a few windows."""
    model, opt = ddp()
    job.models.append(model)
    with job.observe(model, pacing="gc") as obs:
        for _ in range(max(job.args.steps, 30)):
            with obs.step(samples=16):
                for _ in range(3000):
                    a: list[object] = []
                    a.append(a)
                job.train_step(model, opt)
        pacer = getattr(getattr(obs, "pacer", None), "pacer", None)
        job.notes["gc_interval"] = getattr(getattr(pacer, "state", None), "gc_interval", None)


@pattern
def p_val(job: Job) -> None:
    """Validation every 5 steps between training steps: eval(), no_grad forwards, all_reduce of the loss."""
    model, opt = ddp()
    job.models.append(model)
    vals = []
    with job.observe(model) as obs:
        for s in range(job.args.steps):
            with obs.step(samples=16):
                job.train_step(model, opt)
            if s % 5 == 4:
                model.eval()
                with torch.no_grad():
                    tot = torch.zeros(2)
                    for _ in range(3):
                        x, y = job.batch(8)
                        tot += torch.stack([F.cross_entropy(model(x), y, reduction="sum"), torch.tensor(8.0)])
                    dist.all_reduce(tot)
                    vals.append(float(tot[0] / tot[1]))
                model.train()
    job.notes["val_losses"] = vals


@pattern
def p_val_wrapped(job: Job) -> None:
    """``p_val`` with ``wrap_collectives=True`` and a logging all_reduce of the loss after every step,
    outside the step (as most loops log): collectives between steps."""
    model, opt = ddp()
    job.models.append(model)
    logged = []
    with job.observe(model, wrap_collectives=True) as obs:
        for s in range(job.args.steps):
            with obs.step(samples=16):
                loss = job.train_step(model, opt)
            v = loss.detach().reshape(1)
            dist.all_reduce(v)
            logged.append(float(v[0]))
            if s % 5 == 4:
                model.eval()
                with torch.no_grad():
                    x, y = job.batch(64)
                    val = F.cross_entropy(model(x), y).reshape(1)
                    time.sleep(0.02)  # a longer validation pass
                    dist.all_reduce(val)
                model.train()
    job.notes["logged"] = logged


@pattern
def p_val_in_step(job: Job) -> None:
    """Validation inside the observed step (after the optimizer step), as some loops nest it."""
    model, opt = ddp()
    job.models.append(model)
    with job.observe(model) as obs:
        for s in range(job.args.steps):
            with obs.step(samples=16):
                job.train_step(model, opt)
                if s % 5 == 4:
                    model.eval()
                    with torch.no_grad():
                        x, y = job.batch(8)
                        v = F.cross_entropy(model(x), y).reshape(1)
                        dist.all_reduce(v)
                    model.train()


@pattern
def p_accum(job: Job) -> None:
    """Gradient accumulation: 4 micro-batches, the first 3 under no_sync()."""
    model, opt = ddp()
    job.models.append(model)
    k = 4
    with job.observe(model) as obs:
        for _ in range(job.args.steps):
            with obs.step(samples=16 * k):
                opt.zero_grad(set_to_none=True)
                for m in range(k):
                    ctx = model.no_sync() if m < k - 1 else contextlib.nullcontext()
                    with ctx:
                        x, y = job.batch()
                        (F.cross_entropy(model(x), y) / k).backward()
                opt.step()
                job.steps_taken += 1


@pattern
def p_accum_micro(job: Job) -> None:
    """Accumulation with ``obs.step()`` around each micro-batch instead of each optimizer step."""
    model, opt = ddp()
    job.models.append(model)
    k = 4
    with job.observe(model) as obs:
        for _ in range(job.args.steps // k):
            opt.zero_grad(set_to_none=True)
            for m in range(k):
                with obs.step(samples=16):
                    ctx = model.no_sync() if m < k - 1 else contextlib.nullcontext()
                    with ctx:
                        x, y = job.batch()
                        (F.cross_entropy(model(x), y) / k).backward()
                    if m == k - 1:
                        opt.step()
                        job.steps_taken += 1


@pattern
def p_accum_flag(job: Job) -> None:
    """nanoGPT's accumulation: model.require_backward_grad_sync set by hand instead of no_sync()."""
    model, opt = ddp()
    job.models.append(model)
    k = 4
    with job.observe(model) as obs:
        for _ in range(job.args.steps):
            with obs.step(samples=16 * k):
                for m in range(k):
                    model.require_backward_grad_sync = m == k - 1
                    x, y = job.batch()
                    (F.cross_entropy(model(x), y) / k).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                job.steps_taken += 1


def _compile(module: Any) -> Any:
    return torch.compile(module, backend=os.environ.get("FP_COMPILE_BACKEND", "inductor"))


@pattern
def p_compile_inner(job: Job) -> None:
    """DDP(torch.compile(model)) — nanoGPT's order is compile first, then DDP (1 MB buckets, as below)."""
    model = DDP(_compile(net(width=768)), bucket_cap_mb=1)
    simple_loop(job, model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))


@pattern
def p_compile_outer(job: Job) -> None:
    """torch.compile(DDP(model)) — dynamo's DDPOptimizer splits the graph at bucket boundaries."""
    # Dynamo's DDPOptimizer asserts that DDP's first bucket (1 MiB) is not larger than the others:
    # buckets of 1 MB on a model big enough for several of them.
    model = DDP(net(width=768), bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    compiled = _compile(model)
    job.models.append(model)
    with job.observe(compiled) as obs:  # the compiled module, as a user holds it
        for _ in range(job.args.steps):
            with obs.step(samples=16):
                job.train_step(compiled, opt)


@pattern
def p_static(job: Job) -> None:
    simple_loop(job, *ddp(static_graph=True, gradient_as_bucket_view=True))


@pattern
def p_tiny_buckets(job: Job) -> None:
    simple_loop(job, *ddp(bucket_cap_mb=0.0001, gradient_as_bucket_view=True))


@pattern
def p_huge_bucket(job: Job) -> None:
    simple_loop(job, *ddp(bucket_cap_mb=1000))


@pattern
def p_bf16(job: Job) -> None:
    model, opt = ddp()
    job.models.append(model)
    with job.observe(model) as obs:
        for _ in range(job.args.steps):
            with obs.step(samples=16):
                x, y = job.batch()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                job.steps_taken += 1


def fsdp2_net() -> torch.nn.Sequential:
    """``net()`` sharded with FSDP2: each Linear layer, then the root (torchtitan's layout)."""
    from torch.distributed.fsdp import fully_shard

    model = net()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


@pattern
def p_fsdp2(job: Job) -> None:
    """FSDP2 fully_shard per layer and at the root; the observer records plain collectives."""
    model = fsdp2_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    job.models.append(model)
    with job.observe(None, wrap_collectives=True) as obs:
        for _ in range(job.args.steps):
            with obs.step(samples=16):
                job.train_step(model, opt)


@pattern
def p_fsdp2_model(job: Job) -> None:
    """FSDP2 with the sharded module passed as ``model`` and nothing else (what a user tries first)."""
    model = fsdp2_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    simple_loop(job, model, opt)


class _Seeded(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Random samples that depend only on (rank, index): the same data in every variant."""

    def __init__(self, rank: int, n: int) -> None:
        self.rank, self.n = rank, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.rank * 100_000 + i)
        return torch.randn(32, generator=g), torch.randint(0, 10, (), generator=g)


@pattern
def p_loader(job: Job) -> None:
    """A DataLoader with 2 worker processes (forked after the observer started its threads), the
    batch fetched inside an ``obs.phase("data")``, and a checkpoint written by rank 0 every 4 steps."""
    model, opt = ddp()
    job.models.append(model)
    loader = torch.utils.data.DataLoader(_Seeded(job.rank, 16 * job.args.steps), batch_size=16,
                                         num_workers=2, shuffle=False)
    with job.observe(model) as obs:
        it = iter(loader)
        for s in range(job.args.steps):
            with obs.step(samples=16):
                with obs.phase("data"):
                    x, y = next(it)
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                job.steps_taken += 1
            if job.rank == 0 and s % 4 == 3:
                job.out.mkdir(parents=True, exist_ok=True)
                torch.save(model.module.state_dict(), job.out / "ckpt.pt")


def _policies(obs: Any) -> list[str] | None:
    controller = getattr(getattr(getattr(obs, "pacer", None), "pacer", None), "controller", None)
    return list(controller.policies) if controller is not None else None


def _slow_loop(job: Job, *, shares: bool) -> None:
    """Rank 1 sleeps 15 ms per step (a persistent straggler): auto pacing (always, whatever
    ``--pacing`` says) wants to rebalance."""
    from fabricpace.pacing import sample_weight

    model, opt = ddp()
    job.models.append(model)
    with job.observe(model, pacing="auto") as obs:
        for _ in range(job.args.steps):
            n = obs.batch_share(32) if shares else 16
            with obs.step(samples=n):
                if job.rank == 1:
                    time.sleep(0.015)
                x, y = job.batch(n)
                loss = F.cross_entropy(model(x), y) * (sample_weight(n, 32, job.world) if shares else 1.0)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                job.steps_taken += 1
        job.notes["policies"] = _policies(obs)


@pattern
def p_slow_rank(job: Job) -> None:
    """A persistent straggler in a loop that does not call obs.batch_share (most loops)."""
    _slow_loop(job, shares=False)


@pattern
def p_slow_rank_shares(job: Job) -> None:
    """The same straggler in a loop that takes its batch from obs.batch_share (rebalance can act)."""
    _slow_loop(job, shares=True)


@pattern
def p_act_ckpt(job: Job) -> None:
    """Activation checkpointing (torch.utils.checkpoint, non-reentrant) of the hidden block under DDP."""
    from torch.utils.checkpoint import checkpoint

    class Ckpt(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.net[1](self.net[0](x))
            h = checkpoint(lambda t: self.net[3](self.net[2](t)), h, use_reentrant=False)
            return self.net[4](h)

    model = DDP(Ckpt(), bucket_cap_mb=0.01)
    simple_loop(job, model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))


@pattern
def p_unused(job: Job) -> None:
    """find_unused_parameters=True with a head used only on even steps (multi-task loops)."""

    class TwoHeads(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = net()
            torch.manual_seed(5)
            self.aux = torch.nn.Linear(10, 10)

        def forward(self, x: torch.Tensor, aux: bool) -> torch.Tensor:
            y = self.body(x)
            return self.aux(y) if aux else y

    model = DDP(TwoHeads(), bucket_cap_mb=0.01, find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    job.models.append(model)
    with job.observe(model) as obs:
        for s in range(job.args.steps):
            with obs.step(samples=16):
                x, y = job.batch()
                loss = F.cross_entropy(model(x, s % 2 == 0), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                job.steps_taken += 1


@pattern
def p_fsdp2_clip(job: Job) -> None:
    """FSDP2 with gradient clipping on the DTensor gradients (torchtitan's loop)."""
    model = fsdp2_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    job.models.append(model)
    with job.observe(model) as obs:
        for _ in range(job.args.steps):
            with obs.step(samples=16):
                x, y = job.batch()
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                opt.step()
                job.steps_taken += 1


@pattern
def p_zero(job: Job) -> None:
    """ZeroRedundancyOptimizer (ZeRO-1: optimizer state sharded, parameters broadcast after each
    step) under DDP, with wrap_collectives=True so its broadcasts are recorded too."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = DDP(net(), bucket_cap_mb=0.01)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.05,
                                  momentum=0.9)
    simple_loop(job, model, opt, wrap_collectives=True)


@pattern
def p_dp_subgroups(job: Job) -> None:
    """DDP over a data-parallel subgroup (the DP dimension of a TP×DP or HSDP layout): ranks of equal
    parity form one DP group of their own (4 ranks: {0, 2} and {1, 3}); the observer is told to
    leave rebalance out (``pacing=["gc", "comm"]`` in such layouts, docs/observer.md)."""
    world = job.world
    groups = [dist.new_group([r for r in range(world) if r % 2 == p]) for p in range(2)]
    model = DDP(net(), bucket_cap_mb=0.01, process_group=groups[job.rank % 2])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    simple_loop(job, model, opt)


@pattern
def p_varbatch(job: Job) -> None:
    """Batch size varies per step and per rank (variable-length data)."""
    model, opt = ddp()
    job.models.append(model)
    with job.observe(model) as obs:
        for s in range(job.args.steps):
            n = 4 + (s * 5 + job.rank * 3) % 29
            with obs.step(samples=n):
                job.train_step(model, opt, n)


@pattern
def p_skip(job: Job) -> None:
    """The optimizer step is skipped on some steps (a non-finite gradient norm, as GradScaler does)."""
    model, opt = ddp()
    job.models.append(model)
    with job.observe(model) as obs:
        for s in range(job.args.steps):
            with obs.step(samples=16):
                x, y = job.batch()
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x), y).backward()
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                if s % 7 == 3 or not torch.isfinite(norm):
                    continue  # skipped: no update this step
                opt.step()
                job.steps_taken += 1


@pattern
def p_two_backward(job: Job) -> None:
    """Two forward/backward passes per step, both synchronized (e.g. two losses stepped apart)."""
    model, opt = ddp()
    job.models.append(model)
    with job.observe(model) as obs:
        for _ in range(job.args.steps):
            with obs.step(samples=32):
                opt.zero_grad(set_to_none=True)
                for _ in range(2):
                    x, y = job.batch()
                    F.cross_entropy(model(x), y).backward()
                opt.step()
                job.steps_taken += 1


@pattern
def p_join(job: Job) -> None:
    """DDP Join for uneven inputs: rank R has 5*R fewer batches than rank 0 (at least 1)."""
    from torch.distributed.algorithms.join import Join

    model, opt = ddp()
    job.models.append(model)
    mine = max(job.args.steps - 5 * job.rank, 1)
    with job.observe(model) as obs, Join([model]):
        for _ in range(mine):
            with obs.step(samples=16):
                job.train_step(model, opt)


@pattern
def p_catch(job: Job) -> None:
    """The user's step raises (on every rank, after the optimizer step) and the loop catches it."""
    model, opt = ddp()
    job.models.append(model)
    caught = 0
    with job.observe(model) as obs:
        for s in range(job.args.steps):
            try:
                with obs.step(samples=16):
                    job.train_step(model, opt)
                    if s % 6 == 2:
                        raise ValueError("bad batch")
            except ValueError:
                caught += 1
    job.notes["caught"] = caught


@pattern
def p_catch_one_rank(job: Job) -> None:
    """Only rank 1 raises inside a step (before its backward: it skips that batch... after it)."""
    model, opt = ddp()
    job.models.append(model)
    caught = 0
    with job.observe(model) as obs:
        for s in range(job.args.steps):
            try:
                with obs.step(samples=16):
                    job.train_step(model, opt)
                    if job.rank == 1 and s % 6 == 2:
                        raise ValueError("logging failed on rank 1")
            except ValueError:
                caught += 1
    job.notes["caught"] = caught


@pattern
def p_early_close(job: Job) -> None:
    """Rank 1 closes its observer half way and keeps training."""
    model, opt = ddp()
    job.models.append(model)
    obs = job.observe(model)
    t_close = []
    for s in range(job.args.steps):
        with obs.step(samples=16):
            job.train_step(model, opt)
        if job.rank == 1 and s == job.args.steps // 2:
            obs.close()
        t_close.append(time.perf_counter())
    obs.close()
    gaps = [b - a for a, b in itertools.pairwise(t_close)]
    job.notes["max_step_gap_s"] = max(gaps) if gaps else 0.0


@pattern
def p_sweep(job: Job) -> None:
    """Two observed runs back to back in one process (a hyper-parameter sweep), new model each."""
    for lr in (0.05, 0.02):
        model, _ = ddp()
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        simple_loop(job, model, opt)


@pattern
def p_two_models(job: Job) -> None:
    """Two DDP modules in one process (GAN-style), each with its own observer, stepped alternately."""
    g, og = ddp()
    torch.manual_seed(1)
    d = DDP(net(1), bucket_cap_mb=0.01)
    od = torch.optim.SGD(d.parameters(), lr=0.05)
    job.models += [g, d]
    with job.observe(g) as obs_g, job.observe(d) as obs_d:
        for _ in range(job.args.steps):
            with obs_g.step(samples=16):
                job.train_step(g, og)
            with obs_d.step(samples=16):
                job.train_step(d, od)


@pattern
def p_observe_twice(job: Job) -> None:
    """observe() twice on the same DDP module (e.g. a library and the user both call it)."""
    model, opt = ddp()
    job.models.append(model)
    with job.observe(model) as outer, job.observe(model) as inner:
        for _ in range(job.args.steps):
            with outer.step(samples=16), inner.step(samples=16):
                job.train_step(model, opt)


def digest(models: list[torch.nn.Module]) -> str:
    h = hashlib.sha256()
    for m in models:
        for name, t in sorted(m.state_dict().items()):
            if hasattr(t, "full_tensor"):  # FSDP2 DTensor: the whole tensor (a collective)
                t = t.full_tensor()
            h.update(name.encode())
            h.update(t.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def describe(job: Job, wall: float, caught: list[Any]) -> dict[str, Any]:
    return {
        "rank": job.rank, "observe": job.args.observe, "pacing": job.args.pacing,
        "digest": digest(job.models), "steps_taken": job.steps_taken, "wall_s": wall, "notes": job.notes,
        "observers": [{"run_dir": str(o.run_dir), "failures": o.failures, "ddp_mode": o.ddp_mode,
                       "steps": o.step_index + 1} for o in job.observers],
        "warnings": sorted({str(w.message)[:200] for w in caught}),
    }


def run_one(args: argparse.Namespace, name: str, out: Path) -> dict[str, Any]:
    job = Job(args, out)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        PATTERNS[name](job)
    return {"pattern": name, **describe(job, time.perf_counter() - t0, caught)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("pattern", help="a pattern name, or 'matrix:P1,P2,...' (each without and with the "
                   "observer, one process group)")
    p.add_argument("--observe", action="store_true")
    p.add_argument("--pacing", default="off")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--window", type=int, default=6)
    p.add_argument("--gather-timeout", type=float, default=30.0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    out = Path(args.out)
    result: dict[str, Any]
    if args.pattern.startswith("matrix:"):
        result = {"rank": dist.get_rank(), "patterns": {}}
        for name in args.pattern.removeprefix("matrix:").split(","):
            pair = {}
            for observed in (False, True):
                args.observe = observed
                pair["observed" if observed else "plain"] = run_one(args, name, out / name)
            result["patterns"][name] = pair
    else:
        if args.pattern not in PATTERNS:
            p.error(f"unknown pattern {args.pattern!r}; known: {', '.join(sorted(PATTERNS))}")
        result = run_one(args, args.pattern, out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(result, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # torch 2.13's gloo teardown can abort a finished rank at exit (see examples/ddp_train.py)
