"""The iteration engine: per-step timelines of every rank, vectorized over ranks, buckets and steps.

DDP (one step, times relative to the moment the previous step's last bucket completed)::

    start_r   = optimizer of the previous step
    pre_r     = start_r + gc pause + host pauses + data loading
    ready_rj  = pre_r + forward_r + backward_r · (bytes of buckets 0..j) / (all gradient bytes)
    issue_rj  = ready_rj, unless the comm actuator's twin holds the launch (it blocks the autograd
                thread, as a DDP comm hook does, so later buckets become ready later too)
    end_j     = max(max_r issue_rj, end_{j-1}) + transfer_j      (NCCL runs a rank's buckets on one
                stream, and a collective starts only when every rank has issued it)
    step end  = end_last + optimizer_r

``end_j`` is computed without a Python loop: with C_j the cumulative transfer, ``end_j - C_j`` is the
running maximum of ``max_r issue_rj - C_{j-1}``. Steps are independent given their origin, so a block
of steps is one set of array operations; only the GC process is stepped one step at a time.

FSDP (``parallelism.kind: fsdp``): one unit per layer; forward all-gathers prefetched one unit ahead
on one stream, backward re-gathers and reduce-scatters each unit's gradients on a second stream;
compute of a unit waits for its gather.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fabricpace.pacing.state import PacingState
from fabricpace.sim.hostnoise import GcState, host_pauses, jitter_factors
from fabricpace.sim.noise import Noise
from fabricpace.sim.transfers import TransferModel
from fabricpace.sim.workload import Workload


@dataclass(frozen=True, kw_only=True)
class Collectives:
    """The collectives of one step, in issue order: op, bytes and stream (0 = gather/all-reduce)."""

    ops: tuple[str, ...]
    sizes: np.ndarray

    @property
    def keys(self) -> list[tuple[str, int]]:
        return [(o, int(b)) for o, b in zip(self.ops, self.sizes, strict=True)]


def step_collectives(workload: Workload) -> Collectives:
    if workload.spec.parallelism.kind == "ddp":
        b = workload.buckets()
        return Collectives(ops=("all_reduce",) * len(b), sizes=b)
    layers = workload.spec.layers
    unit = workload.grad_bytes_per_gpu // layers
    ops = ("all_gather",) * (2 * layers) + ("reduce_scatter",) * layers
    return Collectives(ops=ops, sizes=np.full(3 * layers, unit, dtype=np.int64))


@dataclass
class BlockResult:
    """Everything one block of steps produced (seconds, absolute on the run's timeline)."""

    steps: np.ndarray  # [S] step numbers
    t_start: np.ndarray  # [S, R]
    t_end: np.ndarray
    compute: np.ndarray
    wait: np.ndarray
    comm: np.ndarray
    data: np.ndarray
    gc: np.ndarray
    gc_count: np.ndarray  # [S, R] bool
    noise: np.ndarray
    paced: np.ndarray
    samples: np.ndarray  # [S, R] int
    issue: np.ndarray  # [S, R, K] absolute
    end: np.ndarray  # [S, K] absolute
    transfer: np.ndarray  # [S] sum over collectives of (end - last issue)
    last: np.ndarray  # [S, K] rank that issued last
    rss_mb: np.ndarray  # [R] at block end


@dataclass
class RankState:
    """What carries from one step block to the next."""

    node_of_rank: np.ndarray
    samples: np.ndarray
    gc: GcState | None
    origin_s: float = 0.0  # absolute time at which the previous step's collectives completed
    prev_opt: np.ndarray | None = None
    pacing: PacingState = field(default_factory=PacingState)
    # The comm actuator's delay budget per rank and step (s): holds stop once it is spent, as the real
    # CommGate's do (max_delay_share × the last window's median step); inf = uncapped (pinned runs).
    comm_budget_s: float = float("inf")


def shares_to_samples(shares: tuple[float, ...] | None, batch: int, world: int) -> np.ndarray:
    """Integer samples per rank for the given shares of the global batch.

    Uses the real rebalance actuator's rounding (``pacing.rebalance.counts_from_shares``), so the twin
    moves exactly the samples a real rank would — including when rounding moves none.
    """
    if shares is None:
        return np.full(world, batch, dtype=np.int64)
    from fabricpace.pacing.rebalance import counts_from_shares

    return np.asarray(counts_from_shares(shares, batch * world, world), dtype=np.int64)


class Engine:
    """Steps the job block by block; the caller applies pacing between blocks."""

    def __init__(
        self,
        *,
        workload: Workload,
        noise: Noise,
        transfers: TransferModel,
        nodes: int,
        gpus_per_node: int,
        seed: int,
        node_order: np.ndarray | None = None,
    ) -> None:
        self.w = workload
        # Node rank k runs on node node_order[k] (ranks k*g .. k*g+g-1); None: node k.
        self.node_order = None if node_order is None else np.asarray(node_order, dtype=np.int64)
        self.noise = noise
        self.nodes = nodes
        self.g = gpus_per_node
        self.world = nodes * gpus_per_node
        self.coll = step_collectives(workload)
        self.cols = transfers.columns(self.coll.keys)
        self.transfers = transfers
        ss = np.random.SeedSequence(seed)
        jit, gc, pause, gcinit = ss.spawn(4)
        self.rng_jitter = np.random.default_rng(jit)
        self.rng_gc = np.random.default_rng(gc)
        self.rng_pause = np.random.default_rng(pause)
        gspec = noise.spec.gc
        self.gc_init = (
            GcState.start(gspec, self.world, np.random.default_rng(gcinit)) if noise.gc_enabled else None
        )
        sizes = self.coll.sizes.astype(float)
        self.frac = np.cumsum(sizes) / sizes.sum() if self.coll.ops[0] == "all_reduce" else None

    def initial_state(self) -> RankState:
        launch = np.arange(self.world) // self.g
        if self.node_order is not None:
            launch = self.node_order[launch]
        return RankState(
            node_of_rank=launch,
            samples=np.full(self.world, self.w.batch_per_gpu, dtype=np.int64),
            gc=self.gc_init,
        )

    # ---- per-rank compute --------------------------------------------------------------------
    def _slow(self, steps: np.ndarray, node_of_rank: np.ndarray) -> np.ndarray:
        f = np.ones((steps.size, self.world))
        ranks = np.arange(self.world)
        for s in self.noise.spec.slow:
            on = (steps >= s.from_step) & (steps < (s.to_step if s.to_step is not None else np.inf))
            who = ranks == s.rank if s.rank is not None else node_of_rank == s.node
            f = np.where(on[:, None] & who[None, :], f * s.factor, f)
        return f

    def run_block(self, state: RankState, steps: np.ndarray) -> BlockResult:
        S, R = steps.size, self.world
        spec = self.w.spec
        scale = state.samples / spec.batch_per_gpu
        work = spec.fixed_compute_fraction + (1 - spec.fixed_compute_fraction) * scale
        base_c = self.w.compute_s * self.w.pipeline_factor() * work  # [R]
        jit = jitter_factors(self.noise.spec.jitter, self.rng_jitter, (S, R))
        slow = self._slow(steps, state.node_of_rank)
        c = base_c[None, :] * jit * slow
        fwd = c * spec.forward_fraction
        bwd = c - fwd
        opt = spec.optimizer_seconds * jit * slow
        data = np.full((S, R), spec.data_seconds)
        pauses = host_pauses(self.noise.spec.pauses, self.rng_pause, (S, R), c + opt)
        gc = np.zeros((S, R))
        gc_count = np.zeros((S, R), dtype=bool)
        if state.gc is not None:
            for i, s in enumerate(steps):
                gc[i], gc_count[i] = state.gc.step(
                    self.rng_gc, scale, state.pacing.gc_interval, int(s), state.pacing.gc_full_interval
                )
        prev = state.prev_opt if state.prev_opt is not None else np.zeros(R)
        a = np.vstack([prev[None, :], opt[:-1]])  # each step starts after the previous optimizer
        pre = a + gc + pauses + data
        times = self.transfers.times[steps][:, self.cols]  # [S, K]
        if self.frac is not None:
            issue, end, _, paced = self._ddp(pre + fwd, bwd, times, state.pacing, state.comm_budget_s)
        else:
            issue, end, _, paced = self._fsdp(pre, fwd, bwd, times)
        E = end[:, -1]
        origin = state.origin_s + np.concatenate([[0.0], np.cumsum(E)[:-1]])  # [S]
        t_start = origin[:, None] + a
        t_end = origin[:, None] + E[:, None] + opt
        comm = _union(issue, end)
        compute = fwd + bwd + opt + pauses  # an observer's phase timers see host pauses as compute
        duration = t_end - t_start
        wait = np.maximum(duration - compute - gc - data - paced, 0.0)
        M = issue.max(axis=1)
        last = issue.argmax(axis=1)
        transfer = (end - M).sum(axis=1)
        state.origin_s = float(origin[-1] + E[-1])
        state.prev_opt = opt[-1].copy()
        rss = np.zeros(R)
        if state.gc is not None:
            rss = state.gc.rss_mb
        return BlockResult(
            steps=steps,
            t_start=t_start,
            t_end=t_end,
            compute=compute,
            wait=wait,
            comm=comm,
            data=data,
            gc=gc,
            gc_count=gc_count,
            noise=pauses,
            paced=paced,
            samples=np.broadcast_to(state.samples, (S, R)).copy(),
            issue=issue + origin[:, None, None],
            end=end + origin[:, None],
            transfer=transfer,
            last=last,
            rss_mb=rss,
        )

    # ---- DDP ----------------------------------------------------------------------------------
    def _ddp(
        self,
        fwd_end: np.ndarray,
        bwd: np.ndarray,
        times: np.ndarray,
        pacing: PacingState,
        budget: float = float("inf"),
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        assert self.frac is not None
        ready = fwd_end[:, :, None] + bwd[:, :, None] * self.frac[None, None, :]  # [S, R, J]
        spacing = pacing.comm_spacing_ns / 1e9
        window = pacing.comm_window
        S, _, J = ready.shape
        if window is None or window >= J:
            if spacing > 0:
                # The hook blocks backward: each gap between buckets becomes at least `spacing`, until
                # the step's delay budget is spent (the holds add up: later buckets shift with them).
                gaps = np.diff(ready, axis=2, prepend=ready[:, :, :1])
                extra = np.zeros_like(gaps)
                extra[:, :, 1:] = np.maximum(spacing - gaps[:, :, 1:], 0.0)
                issue = ready + np.minimum(np.cumsum(extra, axis=2), budget)
            else:
                issue = ready
            M = issue.max(axis=1)  # [S, J]
            C = np.cumsum(times, axis=1)
            end = np.maximum.accumulate(M - (C - times), axis=1) + C
        else:
            # In-flight window: a launch waits until bucket j-window completed (needs a loop over j).
            issue = np.empty_like(ready)
            end = np.empty((S, J))
            gaps = np.diff(ready, axis=2, prepend=ready[:, :, :1])
            prev_issue = None
            prev_end = np.full(S, -np.inf)
            used = np.zeros(ready.shape[:2])  # hold so far per (step, rank), against the budget
            for j in range(J):
                if prev_issue is None:
                    natural = cur = ready[:, :, 0]
                else:
                    natural = prev_issue + gaps[:, :, j]  # arrival at the hook (earlier holds included)
                    cur = prev_issue + np.maximum(gaps[:, :, j], spacing)
                if j >= window:
                    cur = np.maximum(cur, end[:, j - window][:, None])
                hold = np.minimum(cur - natural, np.maximum(budget - used, 0.0))
                cur = natural + hold
                used += hold
                issue[:, :, j] = cur
                prev_end = np.maximum(cur.max(axis=1), prev_end) + times[:, j]
                end[:, j] = prev_end
                prev_issue = cur
        paced = issue[:, :, -1] - ready[:, :, -1]  # total hold = shift of backward's end
        return issue, end, issue[:, :, -1], paced

    # ---- FSDP ---------------------------------------------------------------------------------
    def _fsdp(
        self, pre: np.ndarray, fwd: np.ndarray, bwd: np.ndarray, times: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        L = self.w.spec.layers
        S, R = pre.shape
        issue = np.empty((S, R, 3 * L))
        end = np.empty((S, 3 * L))
        f_u, b_u = fwd / L, bwd / L
        cursor = pre.copy()
        gather_end = np.full(S, -np.inf)
        reduce_end = np.full(S, -np.inf)
        launch = pre
        for k in range(2 * L):  # gathers: forward units 0..L-1, then backward units L-1..0
            unit_time = f_u if k < L else b_u
            issue[:, :, k] = launch
            gather_end = np.maximum(launch.max(axis=1), gather_end) + times[:, k]
            end[:, k] = gather_end
            start = np.maximum(cursor, gather_end[:, None])
            launch = start  # prefetch: the next gather is issued when this unit starts computing
            cursor = start + unit_time
            if k >= L:
                r = 2 * L + (k - L)
                issue[:, :, r] = cursor
                reduce_end = np.maximum(cursor.max(axis=1), reduce_end) + times[:, r]
                end[:, r] = reduce_end
        return issue, end, cursor, np.zeros((S, R))


def _union(issue: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per (step, rank): length of the union of the intervals [issue_k, end_k] (collectives in flight).

    Intervals are visited in the fleet's mean issue order (exact for DDP, whose order is fixed; for
    FSDP's two streams the order can differ between ranks by a few collectives, a small error).
    """
    order = np.argsort(issue.mean(axis=(0, 1)), kind="stable")
    iss, en = issue[:, :, order], end[:, order]
    reach = np.maximum.accumulate(en, axis=1)
    prev = np.concatenate([np.full((en.shape[0], 1), -np.inf), reach[:, :-1]], axis=1)
    return np.maximum(en[:, None, :] - np.maximum(iss, prev[:, None, :]), 0.0).sum(axis=2)
