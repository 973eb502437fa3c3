"""Synthetic run directories with exact, known faults — for the diagnosis tests and its benchmark.

Not a simulator (``fabricpace.sim`` is): a few lines of numpy that lay out a DDP-like timeline per rank
and step so a test controls every cause. Each step, every rank loads data, maybe pauses for GC, computes
(buckets become ready at fixed fractions of its compute), all-reduces ``buckets`` buckets over the
``dp`` group (a bucket's transfer starts when its last rank arrives and after the previous bucket), and
runs its optimizer; the next step starts when the last bucket completed. Faults:

* ``slow_ranks`` / ``slow_factor``: persistent compute slowdown (a slow node: all its ranks);
* ``gc_prob`` / ``gc_ms``: independent per-rank GC pauses (synchronization amplification);
  ``gc_ranks`` confines them to some ranks (an intermittent straggler);
* ``data_ms`` / ``stall_ranks`` / ``stall_ms``: data-loader wait everywhere / on some ranks;
* ``pair_groups`` + ``cross_leaf_factor``: extra all-gathers over pairs of neighbouring nodes, the
  pairs that cross a leaf inflated (topology contention); ``foreign`` = (first, last, factor) inflates
  every transfer in a period of steps (foreign traffic);
* ``stages`` / ``stage_factor``: pipeline stages, one with more work (stage imbalance);
* ``clock_err_ns`` (None = unknown) and ``clock_skew_ns``: per-host clock offsets left in the data.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fabricpace.run import Manifest, RunWriter


@dataclass(frozen=True, kw_only=True)
class SynthSpec:
    ranks: int = 16
    gpus_per_node: int = 4
    nodes_per_leaf: int = 2
    steps: int = 200
    compute_ms: float = 80.0
    jitter: float = 0.01  # relative σ of per-step compute
    optimizer_ms: float = 5.0
    buckets: int = 2
    bucket_bytes: int = 25 << 20
    transfer_ms: float = 10.0  # per bucket
    transfer_jitter: float = 0.03
    slow_ranks: tuple[int, ...] = ()
    slow_factor: float = 1.0
    gc_prob: float = 0.0
    gc_ms: float = 0.0
    gc_ranks: tuple[int, ...] = ()  # only these ranks pause for GC (empty: every rank)
    data_ms: float = 1.0
    stall_ranks: tuple[int, ...] = ()
    stall_ms: float = 0.0
    pair_groups: bool = False
    pair_transfer_ms: float = 4.0
    cross_leaf_factor: float = 1.0
    foreign: tuple[int, int, float] | None = None
    stages: int = 1
    slow_stage: int | None = None
    stage_factor: float = 1.0
    clock_err_ns: int | None = 20_000
    clock_skew_ns: int = 0
    seed: int = 0
    workload: dict[str, object] = field(default_factory=lambda: {"name": "synthetic"})


def write_synthetic(out_dir: str | os.PathLike[str], spec: SynthSpec) -> Path:
    """Write a complete run directory for ``spec`` and return its path."""
    rng = np.random.default_rng(spec.seed)
    n, s, g = spec.ranks, spec.steps, spec.gpus_per_node
    ms = 1e6
    node = np.arange(n) // g
    leaf = node // spec.nodes_per_leaf
    stage = (np.arange(n) * spec.stages) // n
    comp = spec.compute_ms * ms * (1 + spec.jitter * rng.standard_normal((n, s)))
    comp[list(spec.slow_ranks)] *= spec.slow_factor
    if spec.slow_stage is not None:
        comp[stage == spec.slow_stage] *= spec.stage_factor
    gc = np.where(rng.random((n, s)) < spec.gc_prob, spec.gc_ms * ms * (0.5 + rng.random((n, s))), 0.0)
    if spec.gc_ranks:
        gc[np.setdiff1d(np.arange(n), list(spec.gc_ranks))] = 0.0
    data = np.full((n, s), spec.data_ms * ms) * (1 + 0.05 * rng.random((n, s)))
    data[list(spec.stall_ranks)] += spec.stall_ms * ms * (0.8 + 0.4 * rng.random((len(spec.stall_ranks), s)))
    foreign = np.ones(s)
    if spec.foreign:
        a, b, f = spec.foreign
        foreign[a:b] = f
    pre = data + gc  # before compute starts

    # Groups: one dp group per pipeline stage, plus optional node-pair groups.
    groups: list[tuple[str, np.ndarray, float, str, int]] = []  # name, members, transfer ns, op, bytes
    for k in range(spec.stages):
        groups.append(
            (
                f"dp{k}" if spec.stages > 1 else "dp",
                np.flatnonzero(stage == k),
                spec.transfer_ms * ms,
                "all_reduce",
                spec.bucket_bytes,
            )
        )
    n_nodes = int(node.max()) + 1
    if spec.pair_groups and n_nodes >= 2:
        for a in range(n_nodes):
            b = (a + 1) % n_nodes
            if b == a or (n_nodes == 2 and a == 1):
                continue
            members = np.flatnonzero((node == a) | (node == b))
            crosses = len(set(leaf[members])) > 1
            t = spec.pair_transfer_ms * ms * (spec.cross_leaf_factor if crosses else 1.0)
            groups.append((f"pair{a}-{b}", members, t, "all_gather", 4 << 20))

    t0 = np.zeros(s)
    rows: dict[str, list[np.ndarray]] = {
        k: [] for k in ("rank", "step", "seq", "group", "op", "bytes", "enter", "exit")
    }
    step_end = np.zeros((n, s))
    rank_last_exit = np.zeros((n, s))
    start = 0.0
    seq_of_group = {name: 0 for name, *_ in groups}
    fracs = np.linspace(1.0 / spec.buckets, 1.0, spec.buckets)
    inside = np.zeros((n, s))
    # Steps are sequential (each starts when the last finished); ranks and buckets are vectorized.
    for j in range(s):
        t0[j] = start
        ready = start + pre[:, j]
        done = np.full(n, start)
        for name, members, tr, op, nbytes in groups:
            prev = start
            for frac in fracs if name.startswith("dp") else fracs[-1:]:
                enter = ready[members] + comp[members, j] * frac
                last = enter.max()
                dur = tr * foreign[j] * (1 + spec.transfer_jitter * abs(rng.standard_normal()))
                finish = max(last, prev) + dur
                prev = finish
                exit_ = finish + rng.random(members.size) * 20_000  # completion seen within 20 µs
                for key, val in (
                    ("rank", members),
                    ("step", np.full(members.size, j)),
                    ("seq", np.full(members.size, seq_of_group[name])),
                    ("enter", enter),
                    ("exit", exit_),
                ):
                    rows[key].append(val)
                rows["group"].append(np.full(members.size, name, dtype=object))
                rows["op"].append(np.full(members.size, op, dtype=object))
                rows["bytes"].append(np.full(members.size, nbytes))
                seq_of_group[name] += 1
                inside[members, j] += exit_ - enter
                done[members] = np.maximum(done[members], exit_)
        rank_last_exit[:, j] = done
        finish_all = done.max()  # the pipeline/next step waits for everyone
        step_end[:, j] = finish_all + spec.optimizer_ms * ms
        start = float(step_end[:, j].max())
    own = pre + comp + spec.optimizer_ms * ms
    dur = step_end - t0[None, :]
    wait = np.clip(dur - own, 0, None)

    offset = np.zeros(n)
    if spec.clock_skew_ns:
        offset = rng.normal(0, spec.clock_skew_ns, n_nodes)[node]
    w = RunWriter(
        out_dir,
        Manifest(
            source="synthetic", world_size=n, nodes=n_nodes, gpus_per_node=g, workload=dict(spec.workload)
        ),
    )
    local = np.arange(n) % g
    w.write(
        "ranks",
        {
            "rank": np.arange(n),
            "node": node,
            "local_rank": local,
            "host": [f"node{x}" for x in node],
            "leaf": leaf,
            "dp_rank": np.arange(n),
            "pp_stage": stage if spec.stages > 1 else [None] * n,
            "tp_rank": [None] * n,
            "numa": local // max(1, g // 2),
            "gpu": [f"GPU{x}" for x in local],
            "nic": [f"mlx5_{x // 2}" for x in local],
            "clock_offset_ns": np.zeros(n, dtype=np.int64),
            "clock_err_ns": [spec.clock_err_ns] * n,
        },
    )
    rr = np.repeat(np.arange(n), s)
    ss = np.tile(np.arange(s), n)
    off_steps = offset[rr]
    w.write(
        "steps",
        {
            "rank": rr,
            "step": ss,
            "t_start_ns": (t0[ss] + off_steps).astype(np.int64),
            "t_end_ns": (step_end.ravel() + off_steps).astype(np.int64),
            "compute_ns": comp.ravel().astype(np.int64),
            "wait_ns": wait.ravel().astype(np.int64),
            "comm_ns": inside.ravel().astype(np.int64),
            "data_ns": data.ravel().astype(np.int64),
            "gc_ns": gc.ravel().astype(np.int64),
            "paced_ns": np.zeros(n * s, dtype=np.int64),
            "samples": np.full(n * s, 32),
        },
    )
    cr = np.concatenate(rows["rank"])
    off_c = offset[cr]
    w.write(
        "collectives",
        {
            "rank": cr,
            "step": np.concatenate(rows["step"]),
            "seq": np.concatenate(rows["seq"]),
            "group": np.concatenate(rows["group"]).astype(str),
            "op": np.concatenate(rows["op"]).astype(str),
            "bytes": np.concatenate(rows["bytes"]),
            "t_enter_ns": (np.concatenate(rows["enter"]) + off_c).astype(np.int64),
            "t_exit_ns": (np.concatenate(rows["exit"]) + off_c).astype(np.int64),
        },
    )
    w.close()
    return Path(out_dir)
