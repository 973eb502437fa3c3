"""A training loop as real jobs write it, observed: accumulation, validation, uneven inputs.

Run it on this machine with 2 or 4 ranks (gloo, CPU):

    fabricpace run --nproc 2 -- examples/real_loop.py --run-dir runs/real-loop
    fabricpace diagnose runs/real-loop

What it shows (docs/observer.md, "Real training loops"):

* ``obs.step()`` wraps one *optimizer* step: the micro-batches of gradient accumulation run under
  ``model.no_sync()`` except the last, and the step's ``samples`` counts all of them;
* validation runs between steps (``model.eval()``, ``torch.no_grad()``, an ``all_reduce`` of the
  loss): it is no step and the next step's wait does not include it;
* the ranks have uneven amounts of data (rank R has ``R * --uneven`` fewer batches), handled by DDP's
  ``Join``: a rank that runs out says so, and the others' window summaries end without a stall;
* the loop does not call ``obs.batch_share()``, so ``--pacing auto`` leaves rebalance out (logged).

``--no-observe`` runs the same loop without the observer; the final parameters are the same bits.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=60, help="optimizer steps of rank 0 (default 60)")
    p.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step (default 4)")
    p.add_argument("--micro", type=int, default=16, help="samples per micro-batch (default 16)")
    p.add_argument("--val-every", type=int, default=10, help="validate every N steps (default 10)")
    p.add_argument("--uneven", type=int, default=5, help="rank R runs R*N fewer steps (default 5)")
    p.add_argument("--run-dir", default=os.environ.get("FABRICPACE_RUN_DIR", "runs/real-loop"))
    p.add_argument("--pacing", default="off", help="pacing mode (default off)")
    p.add_argument("--window", type=int, default=10, help="observer window in steps (default 10)")
    p.add_argument("--no-observe", action="store_true", help="run without the observer")
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                              torch.nn.ReLU(), torch.nn.Linear(256, 10))
    model = DDP(net, bucket_cap_mb=0.25)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1000 + rank)
    my_steps = max(args.steps - rank * args.uneven, 1)
    # Join shadows DDP's collectives only: a collective of your own (the validation all_reduce) must
    # run while every rank still has data, or a rank that joined never answers it.
    all_active = max(args.steps - (dist.get_world_size() - 1) * args.uneven, 1)

    if args.no_observe:
        obs = None
        ctx: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
    else:
        import fabricpace

        obs = fabricpace.observe(model, run_dir=args.run_dir, pacing=args.pacing, window=args.window)
        ctx = obs

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, 64, generator=gen), torch.randint(0, 10, (n,), generator=gen)

    with ctx, Join([model]):
        for step in range(my_steps):
            span = obs.step(samples=args.micro * args.accum) if obs else contextlib.nullcontext()
            with span:
                opt.zero_grad(set_to_none=True)
                for m in range(args.accum):
                    sync = contextlib.nullcontext() if m == args.accum - 1 else model.no_sync()
                    with sync:
                        x, y = batch(args.micro)
                        (F.cross_entropy(model(x), y) / args.accum).backward()
                opt.step()
            if (step + 1) % args.val_every == 0 and step < all_active:
                model.eval()
                with torch.no_grad():
                    x, y = batch(256)
                    val = F.cross_entropy(model(x), y).reshape(1)
                dist.all_reduce(val)
                model.train()
                if rank == 0:
                    loss = float(val[0]) / dist.get_world_size()
                    print(f"step {step + 1}: val loss {loss:.4f}", flush=True)
    state = model.module.state_dict().values()
    digest = hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in state))
    where = f" -> {obs.run_dir}" if obs is not None else ""
    print(f"rank {rank}: {my_steps} steps, parameters {digest.hexdigest()[:16]}{where}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # torch 2.13's gloo teardown can abort a finished rank at exit (see ddp_train.py)
