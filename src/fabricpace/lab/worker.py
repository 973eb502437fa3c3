"""The lab's training worker: gloo DDP on a small MLP with synthetic data, observer on, faults by flags.

Started once per rank by the lab launcher (inside a node's namespace), by ``study --backend local`` and
by the demo (plain processes on loopback). Rendezvous comes from the usual torch.distributed variables
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); inside a namespace GLOO_SOCKET_IFNAME names its interface.

    python -m fabricpace.lab.worker --run-dir RUN --steps 200 [--pacing auto] [--gc-noise-ranks all]

The host has a few cores for many ranks, so each rank can stand in for a GPU node: with
``--device-ms-per-sample`` the rank also waits that long per sample between forward and backward, as a
host thread waits for its accelerator. The model, gradients, all-reduce and optimizer step stay real;
only the accelerator's arithmetic is replaced by its duration, so 8 ranks on 2 cores behave like 8 nodes
instead of 8 processes fighting over 2 cores. Host work (Python, GC, the CPU part of the MLP) still
competes for the CPU, which is where the GC and throttling faults act.

The loss is summed over this rank's samples and divided by the global batch (times the world size,
which DDP divides by again), so the update does not change when pacing moves samples between ranks.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path


def _ranks(spec: str, world: int) -> set[int]:
    if not spec:
        return set()
    if spec == "all":
        return set(range(world))
    return {int(r) for r in spec.split(",") if r.strip()}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fabricpace.lab.worker", description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-per-rank", type=int, default=64, help="global batch = this × world size")
    p.add_argument("--device-ms-per-sample", type=float, default=0.0,
                   help="accelerator time per sample, spent waiting (see module docstring)")
    p.add_argument("--in-dim", type=int, default=128)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--pacing", default="off", choices=("off", "auto"))
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=120.0, help="process-group timeout")
    # Faults carried out inside the worker.
    p.add_argument("--gc-noise-ranks", default="", help="'all' or comma-separated ranks with GC pressure")
    p.add_argument("--gc-heap", type=int, default=300_000, help="live objects kept by a noisy rank")
    p.add_argument("--gc-churn", type=int, default=20_000, help="mean cyclic objects allocated per step")
    p.add_argument("--gc-lifetime", type=int, default=3, help="steps a churned object lives")
    p.add_argument("--slow-ranks", default="", help="ranks that do extra compute (when cgroups are missing)")
    p.add_argument("--slow-factor", type=float, default=1.0, help="compute multiplier of --slow-ranks")
    p.add_argument("--progress-file", default="", help="rank 0 writes its step here every 10 steps")
    return p


def own_hostname() -> str | None:
    """Inside the lab (``FABRICPACE_LAB_HOSTNAME`` set by the launcher, root): give this process a UTS
    namespace of its own named after its node, as a real node has its own host name. Network
    namespaces share the host's name, so the observer counted one host for every rank. Returns the
    name set, or None (not in the lab, or not allowed: the run goes on with the shared name)."""
    name = os.environ.get("FABRICPACE_LAB_HOSTNAME", "").strip()
    if not name:
        return None
    import ctypes
    import socket

    clone_newuts = 0x04000000
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(clone_newuts) != 0:
            return None
        socket.sethostname(name)
    except (OSError, AttributeError):
        return None
    return name


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    own_hostname()  # before any thread starts: unshare() acts on the calling thread
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from fabricpace.observe import observe

    torch.set_num_threads(1)  # many ranks share a few cores; intra-op threads would only fight
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=args.timeout_s))
    torch.manual_seed(args.seed)  # identical initial weights on every rank
    dims = [args.in_dim] + [args.hidden] * args.layers
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(dims):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(dims[-1], args.classes))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)

    noise = None
    if rank in _ranks(args.gc_noise_ranks, world):
        from fabricpace.lab.noise import GcPressure

        noise = GcPressure(heap_objects=args.gc_heap, churn_objects=args.gc_churn,
                           lifetime_steps=args.gc_lifetime, seed=args.seed * 7919 + rank)
    extra = round(args.slow_factor - 1.0) if rank in _ranks(args.slow_ranks, world) else 0
    progress = Path(args.progress_file) if args.progress_file and rank == 0 else None
    global_batch = args.batch_per_rank * world
    device_s_per_sample = args.device_ms_per_sample / 1000.0

    with observe(ddp, run_dir=args.run_dir, pacing=args.pacing, window=args.window) as obs:
        if progress is not None:
            # The observer's time origin (perf_counter_ns = CLOCK_MONOTONIC, shared by all namespaces):
            # lets the launcher put fault events (foreign-flow bursts) on the run's aligned timeline.
            t0 = getattr(obs, "t0", None)
            progress.with_name("t0.json").write_text(json.dumps({"t0_monotonic_ns": t0}))
        for step in range(args.steps):
            n = max(1, obs.batch_share(global_batch))
            with obs.step(samples=n):
                with obs.phase("data"):
                    x = torch.randn(n, args.in_dim, generator=gen)
                    y = torch.randint(0, args.classes, (n,), generator=gen)
                if noise is not None:
                    noise.step()
                loss = loss_fn(ddp(x), y) * (world / global_batch)
                if device_s_per_sample > 0:
                    # The accelerator's share of forward+backward: the host waits, as it does for a GPU,
                    # before gradients become ready and DDP launches its buckets.
                    time.sleep(device_s_per_sample * n)
                for _ in range(extra):
                    # Extra work of the same kind on a detached copy: slower compute, same gradients.
                    with torch.no_grad():
                        model(x)
                    xx = x.clone().requires_grad_(True)
                    (model(xx).sum() * 0.0).backward(inputs=[xx])
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            if progress is not None and step % 10 == 0:
                progress.write_text(str(step))
    if progress is not None:
        progress.write_text(str(args.steps))
    dist.barrier()  # nobody tears down gloo while a peer still talks to it
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # The run directory is closed and flushed by now. Skip interpreter teardown: torch's C++ static
    # destructors can abort ("terminate called without an active exception") when a gloo or store
    # thread is still winding down, which would turn a finished run into a failed rank.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
