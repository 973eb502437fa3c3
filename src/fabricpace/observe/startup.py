"""Start-up helpers of the observer: rank and world discovery, the run directory, the manifest's
workload description and the ranks table. Run once per observer, never on the hot path."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from fabricpace.observe._guard import LOG
from fabricpace.run.schema import RANK_SCHEMA


def rank_world() -> tuple[int, int, bool]:
    """(rank, world, distributed): from the process group when initialized, else the environment."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size(), dist.get_world_size() > 1
    except ImportError:
        pass
    rank = int(os.environ.get("RANK", "0") or 0)
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world > 1:
        LOG.warning("fabricpace observer: WORLD_SIZE=%d but no process group is initialized; "
                    "recording this rank only (no window gathers, no clock alignment)", world)
    return rank, world, False


def on_cuda(model: Any) -> bool:
    if model is None:
        return False
    try:
        return any(p.is_cuda for p in model.parameters())
    except Exception:
        return False


def cuda_device(model: Any) -> Any:
    """The CUDA device of the model's first CUDA parameter (None when it has none): the observer's
    step stamps must go on that device's stream, whatever the current device is."""
    try:
        return next((p.device for p in model.parameters() if p.is_cuda), None)
    except Exception:
        return None


def default_run_dir() -> Path:
    return Path("runs") / time.strftime("%Y%m%d-%H%M%S", time.gmtime())


_RANK_DIR = re.compile(r"rank-\d{5}")


def sibling(path: Path, n: int) -> Path:
    """``path`` itself for 0, else ``path-n``: where a run goes when ``path`` is taken."""
    return path if n == 0 else path.with_name(f"{path.name}-{n}")


def taken(candidate: Path, rank: int = 0) -> bool:
    """Whether this rank must not write its run into ``candidate``: a file or a broken symbolic link
    (exists() calls it absent, and mkdir would then fail), or a directory holding rows of this rank
    (``TABLE/rank-R/``, which its first parts would overwrite); for rank 0, which writes the manifest,
    also anything else but other ranks' row folders (those can be the same job's, when ranks that
    have no process group start at different moments)."""
    if candidate.is_symlink() and not candidate.exists():
        return True
    if not candidate.exists():
        return False
    if not candidate.is_dir():
        return True
    if any(candidate.glob(f"*/rank-{rank:05d}/*")):
        return True
    if rank != 0:
        return False
    for entry in candidate.iterdir():
        subs = list(entry.iterdir()) if entry.is_dir() else []
        if not subs or not all(sub.is_dir() and _RANK_DIR.fullmatch(sub.name) for sub in subs):
            return True
    return False


def first_free(path: Path, rank: int = 0, start: int = 0) -> int:
    """The first ``n >= start`` whose ``sibling(path, n)`` is not taken for ``rank``."""
    n = start
    while taken(sibling(path, n), rank):
        n += 1
    return n


def fresh_dir(path: Path, rank: int = 0) -> Path:
    """``path`` if this rank may write its run there, else the first free sibling ``path-1``,
    ``path-2``, ... (no overwrite). Ranks that cannot agree on a directory (no process group) each
    call this: rank 0 takes the first empty one, every other rank the first holding no rows of its
    own, which after a complete earlier run is the same one."""
    candidate = sibling(path, first_free(path, rank))
    if candidate != path:
        LOG.warning("fabricpace observer: %s is taken (%s); writing this run to %s", path,
                    "not empty, a file or a broken link" if rank == 0 else f"it holds rank {rank}'s rows",
                    candidate)
    return candidate


# File descriptors kept free for the job's own files, sockets and pipes (data loader workers, logs,
# checkpoints) besides those open at start and the observer's gloo group.
FD_SPARE = 256


def fds_open() -> int:
    """Descriptors this process has open now (64, a guess, where /proc cannot tell)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 64


def fd_plan(soft: int, hard: int, *, world: int, open_now: int) -> tuple[int, int | None]:
    """(need, soft limit to set) for the observer's gloo group: gloo connects every rank of a group
    to every other (a full mesh: world − 1 sockets per process, 4,095 at 4,096 ranks), so the group
    needs ``open_now + world + FD_SPARE`` descriptors. The second item is None when the soft limit
    already allows that, else twice the need (room for the job to grow), at most the hard limit;
    when even the hard limit is short it is the hard limit (the caller checks against ``need``).
    ``-1`` is ``RLIM_INFINITY``."""
    need = open_now + world + FD_SPARE
    if soft < 0 or soft >= need:
        return need, None
    return need, 2 * need if hard < 0 else min(hard, 2 * need)


def ensure_fds(world: int, rank: int) -> str | None:
    """Make room for the observer's gloo group in this process's open-file limit (RLIMIT_NOFILE):
    raise the soft limit when it is short (up to the hard limit; allowed without privileges). None
    when there is room, else why there is not, in one line naming the limit and ``ulimit -n``.
    Before, a job of more ranks than the soft limit (commonly 1,024) failed in gloo's connect, or
    later in the job's own file opens (audit 17 A3 finding 5)."""
    try:
        import resource
    except ImportError:  # not a POSIX system: nothing to check
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        inf = resource.RLIM_INFINITY
        need, target = fd_plan(-1 if soft == inf else soft, -1 if hard == inf else hard,
                               world=world, open_now=fds_open())
        if target is None:
            return None
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
            if soft >= need and rank == 0:
                LOG.info("fabricpace observer: open-file limit raised to %d for its gloo group (%d ranks)",
                         soft, world)
    except (OSError, ValueError) as exc:  # the kernel refused (e.g. above fs.nr_open): check what is
        LOG.info("fabricpace observer (rank %d): could not raise the open-file limit: %s", rank, exc)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        need = fds_open() + world + FD_SPARE
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    return (f"rank {rank}'s open-file limit (RLIMIT_NOFILE) is {soft} and its hard limit "
            f"{'unlimited' if hard == resource.RLIM_INFINITY else hard}, below the {need} the observer's "
            f"gloo group needs (a socket per rank: {world} ranks, plus files open and {FD_SPARE} spare); "
            f"raise it before launching, e.g. `ulimit -n {2 * need}`")


def start_gate(store: Any, *, rank: int, world: int, session: int, timeout_s: float) -> None:
    """Wait (at most ``timeout_s``) until every rank has reached the observer's start, before the
    private gloo group is made; raise when the start is given up, on every rank alike.

    Without it a rank that arrived after its peers gave up (they waited ``timeout_s`` in
    ``new_group``) blocked about 110 s in gloo's full-mesh connect to peers that had left. One
    decision per start, taken once on the job's Store with ``compare_set``: the last rank to arrive
    writes "on", a rank whose wait ran out writes "off"; whichever comes first holds for every rank,
    so a late rank reads "off" at once and costs no more than its lateness. Keys are under the
    torchrun restart count and the observer session (as ``sidechannel.session_token``)."""
    from datetime import timedelta

    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    key = f"fabricpace-observer/gate/{restart}/{session}"
    short = ensure_fds(world, rank)
    if short is not None:
        # Never arrive: the group cannot be made here, so no rank may make it (a rank connecting
        # to a peer that never does waits gather_timeout_s, ~110 s before the gate). Why goes first,
        # so a rank that reads "off" can say it.
        store.set(f"{key}/why", short)
        store.compare_set(f"{key}/go", "", "off")
        raise RuntimeError(f"{short}; the observer is off on every rank")
    arrived = int(store.add(f"{key}/arrived", 1))
    gave_up = False
    if arrived >= world:
        decision = bytes(store.compare_set(f"{key}/go", "", "on"))
    else:
        try:
            store.wait([f"{key}/go"], timedelta(seconds=timeout_s))
            decision = bytes(store.get(f"{key}/go"))
        except Exception:  # the wait ran out: give the start up for every rank (unless just decided)
            decision = bytes(store.compare_set(f"{key}/go", "", "off"))
            gave_up = True
    if decision == b"on":
        return
    if store.check([f"{key}/why"]):
        raise RuntimeError(f"{bytes(store.get(f'{key}/why')).decode()}; the observer is off on every rank")
    if gave_up:
        missing = max(world - int(store.add(f"{key}/arrived", 0)), 1)
        raise RuntimeError(f"{missing} of {world} rank(s) had not reached observe() after gather_timeout_s "
                           f"({timeout_s:g} s); the observer is off on every rank")
    raise RuntimeError(f"this rank reached observe() after its peers gave up waiting for it "
                       f"(gather_timeout_s {timeout_s:g} s); the observer is off on every rank")


def agreed_dir(path: Path, rank: int, group: Any,
               settings: tuple[int, ...] = ()) -> tuple[Path, tuple[int, ...] | None]:
    """The first sibling of ``path`` that every rank of ``group`` may write into (``taken``), agreed
    with two small all-reduces over the observer's gloo group: on a shared file system that is
    rank 0's choice; on per-node disks a node whose own disk already holds rows of its ranks in
    rank 0's choice moves every rank on, instead of overwriting them.

    ``settings`` (non-negative integers that must be equal on every rank: ``window``,
    ``gather_lag_steps``) ride on the first all-reduce: the second item returned is None when every
    rank passed the same, else rank 0's values (the caller uses them and says so)."""
    import torch
    import torch.distributed as dist

    k = len(settings)
    # MAX of (v, -v) gives the largest and smallest value; rank 0's own values beat everyone's -1.
    mine = [*settings, *(-v for v in settings), *(settings if rank == 0 else (-1,) * k)]
    n = 0
    agreed: tuple[int, ...] | None = None
    first = True
    while True:
        proposal = torch.tensor([first_free(path, rank, n), *(mine if first else ())], dtype=torch.int64)
        dist.all_reduce(proposal, op=dist.ReduceOp.MAX, group=group)
        values = [int(v) for v in proposal.tolist()]
        n = values[0]
        if first and k:
            high, low, rank0 = values[1:1 + k], [-v for v in values[1 + k:1 + 2 * k]], values[1 + 2 * k:]
            agreed = None if high == low else tuple(rank0)
        first = False
        ok = torch.tensor([0 if taken(sibling(path, n), rank) else 1], dtype=torch.int64)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
        if int(ok.item()):
            break
        n += 1
    if n and rank == 0:
        LOG.warning("fabricpace observer: %s is taken (not empty, a file or a broken link, or holding "
                    "rows of some rank on its node); writing this run to %s", path, sibling(path, n))
    return sibling(path, n), agreed


def workload(model: Any) -> dict[str, Any]:
    if model is None:
        return {}
    inner = getattr(model, "module", model)
    try:
        params = int(sum(p.numel() for p in inner.parameters()))
    except Exception:
        params = None
    return {"model": type(inner).__name__, "parameters": params}


def number_leaves(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with ``leaf`` numbered 0, 1, ... by first appearance of ``leaf_name`` in rank order (ranks
    without a name keep their ``leaf``): diagnosis and placement only compare leaves."""
    ids: dict[str, int] = {}
    out = []
    for row in sorted(rows, key=lambda r: r.get("rank", 0)):
        name = row.get("leaf_name")
        if name is not None and row.get("leaf") is None:
            row = {**row, "leaf": ids.setdefault(str(name), len(ids))}
        out.append(row)
    return out


def ranks_table(rows: list[dict[str, Any]]) -> pa.Table:
    rows = number_leaves(rows)
    arrays, fields = [], []
    for f in RANK_SCHEMA:
        arr = pa.array([r.get(f.name) for r in rows], type=f.type)
        arrays.append(arr)
        fields.append(f)
    for key in ("local_world_size", "cpu_affinity", "gpu_pci", "gpu_numa", "nic_numa", "pid", "leaf_name"):
        arr = pa.array([r.get(key) for r in rows])
        arrays.append(arr)
        fields.append(pa.field(key, arr.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))
