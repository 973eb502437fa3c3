"""A small DDP training job with the fabricpace observer: synthetic data, optional faults.

Run it on this machine with 4 ranks (gloo, CPU):

    fabricpace run --nproc 4 -- examples/ddp_train.py --steps 200 --slow-rank 3 --slow-ms 20
    fabricpace diagnose runs/ddp-example

Options inject the two kinds of noise the diagnosis separates: ``--slow-rank R --slow-ms X`` makes
rank R sleep X ms in every step (a persistent straggler, locality-driven variance), and
``--gc-churn N`` allocates N cyclic objects per step so Python's collector pauses at random steps
(host noise that synchronization amplifies). ``--no-observe`` runs the same job without the
observer (for overhead comparisons).
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def positive(text: str) -> int:
    """argparse type: an integer >= 1 (``--steps 0`` or ``-5`` used to finish at once with exit 0)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=positive, default=200, help="training steps (default 200)")
    p.add_argument("--batch", type=positive, default=32, help="global batch size (default 32)")
    p.add_argument("--hidden", type=positive, default=256, help="hidden width of the MLP (default 256)")
    p.add_argument("--layers", type=positive, default=4, help="hidden layers (default 4)")
    p.add_argument("--bucket-mb", type=float, default=0.25, help="DDP bucket cap in MB (default 0.25)")
    p.add_argument("--run-dir", default=os.environ.get("FABRICPACE_RUN_DIR", "runs/ddp-example"))
    p.add_argument("--window", type=positive, default=50, help="observer window in steps (default 50)")
    p.add_argument("--flush-every", type=positive, default=50, help="min steps per chunk (default 50)")
    p.add_argument("--flush-interval", type=float, default=5.0, help="min seconds between chunks (default 5)")
    p.add_argument("--pacing", default="off", help="pacing mode (default off)")
    p.add_argument("--slow-rank", type=int, default=-1, help="rank that sleeps in every step")
    p.add_argument("--slow-ms", type=float, default=0.0, help="sleep of the slow rank per step, ms")
    p.add_argument("--gc-churn", type=int, default=0, help="cyclic objects allocated per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-observe", action="store_true", help="run without the observer")
    p.add_argument("--metrics-port", type=int, default=None)
    return p.parse_args(argv)


def build_model(hidden: int, layers: int, seed: int):  # type: ignore[no-untyped-def]
    import torch

    torch.manual_seed(seed)  # same initial weights on every rank (DDP also broadcasts them)
    mods: list[torch.nn.Module] = [torch.nn.Linear(64, hidden), torch.nn.ReLU()]
    for _ in range(layers - 1):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    mods.append(torch.nn.Linear(hidden, 10))
    return torch.nn.Sequential(*mods)


def churn(n: int) -> None:
    """Allocate reference cycles so the cyclic collector runs now and then."""
    for _ in range(n):
        a: list[object] = []
        a.append(a)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import contextlib

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)  # several ranks share a few cores here
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DDP(build_model(args.hidden, args.layers, args.seed), bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1000 + rank)
    if args.no_observe:
        obs = None
        ctx: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
    else:
        import fabricpace
        from fabricpace.observe import ObserverConfig
        from fabricpace.pacing import sample_weight

        obs = fabricpace.observe(model, run_dir=args.run_dir, pacing=args.pacing, window=args.window,
                                 metrics_port=args.metrics_port,
                                 config=ObserverConfig(flush_every=args.flush_every,
                                                       flush_interval_s=args.flush_interval))
        ctx = obs
    t0 = time.perf_counter()
    with ctx:
        for _ in range(args.steps):
            n = obs.batch_share(args.batch) if obs is not None else args.batch // world
            step = obs.step(samples=n) if obs is not None else contextlib.nullcontext()
            with step:
                data = obs.phase("data") if obs is not None else contextlib.nullcontext()
                with data:
                    x = torch.randn(n, 64, generator=gen)
                    y = torch.randint(0, 10, (n,), generator=gen)
                if rank == args.slow_rank and args.slow_ms > 0:
                    time.sleep(args.slow_ms / 1e3)
                churn(args.gc_churn)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                if obs is not None:
                    # Rebalance (--pacing auto) gives ranks unequal batches; DDP averages the ranks'
                    # gradients equally, so weight each rank's mean loss by its share of the global
                    # batch: the update stays the global-batch mean (factor 1 when shares are equal).
                    loss = loss * sample_weight(n, args.batch, world)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    if rank == 0:
        where = f" -> {obs.run_dir}" if obs is not None else ""
        print(f"rank 0: {args.steps} steps in {time.perf_counter() - t0:.2f} s{where}", flush=True)
    # Tear gloo down only when every peer is done with it; without this barrier a rank that finishes
    # first can abort in torch's teardown ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Everything is flushed and closed by now. torch 2.13's gloo teardown can still abort a finished
    # rank at interpreter exit ("terminate called without an active exception", seen here with and
    # without fabricpace), which torchrun reports as a failed job: skip interpreter teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
