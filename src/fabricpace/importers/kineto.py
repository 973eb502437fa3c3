"""Import PyTorch-profiler (Kineto) Chrome traces into a run directory, streaming with bounded memory.

One trace file per rank (``.json`` or ``.json.gz``). The ``traceEvents`` array is parsed event by event
with ijson's C backend (an incremental tokenizer), so memory does not grow with the file: only the
few fields kept per event (a name id and two floats) are stored, in compact arrays. The small
top-level keys are read separately: those before ``traceEvents`` (``distributedInfo``) from the head of
the file, those after it (``baseTimeNanoseconds``) from a tail buffer kept while streaming.

What is kept (DESIGN.md run directory):

- steps from ``ProfilerStep#N`` (the CPU annotation gives the step's start and end; the GPU copy,
  ``gpu_user_annotation``, when present, gives the window used to assign GPU work to steps);
- collectives from GPU kernels (``ncclKernel*``, ``ncclDevKernel*``, RCCL's names) with their NCCL
  metadata args (``Collective name``, ``In/Out msg nelems``, ``dtype``, ``Process Group Name``);
  a trace without communication kernels (gloo, CPU) falls back to CPU ops: the ``gloo:*`` spans of
  gloo's worker threads paired in order with the issuing ops (``record_param_comms`` / ``c10d::*``),
  which give op/bytes/group and the arrival; without gloo spans, the issuing ops. ``t_enter`` is when
  this rank reached the collective (its arrival: the kernel's start, the issuing op's start on gloo)
  and ``t_exit`` the kernel's (gloo span's) end;
- per step, time inside the step's window only (intervals are cut to it): ``comm_ns`` = time covered
  by communication kernels, ``compute_ns`` = time covered by other kernels, ``wait_ns`` =
  communication not hidden under compute (exposed communication, which includes waiting for late
  peers); CPU-only traces: ``comm_ns`` = time covered by the step's own collectives, ``wait_ns`` = the
  same less data loading, ``compute_ns`` = step - wait - data - gc; ``data_ns`` =
  ``enumerate(DataLoader)*`` annotations;
- checks across ranks: traces of different runs (a rank's steps starting far from the other ranks'
  same steps) are refused, unless ``allow_clock_skew`` says the hosts' clocks disagree (then each
  rank is aligned by the median offset of its step starts, kept in ``ranks.clock_offset_ns``); ranks
  the traces' ``world_size`` names but the folder lacks are said on stderr (and by every reader of
  the run, ``run/coverage.py``);
- ops: every GPU kernel / memcpy / memset (``--no-ops`` leaves them out).

Times: absolute ns = ``baseTimeNanoseconds`` (0 when absent) + ts µs × 1000, then shifted so the first
step start of any rank is 0. Profiler clocks of different hosts are taken as synchronized
(``clock_err_ns`` is left null: unknown), unless ``allow_clock_skew`` aligns them as above.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from fabricpace._errors import RunDirError
from fabricpace.importers.intervals import covered_in_windows, intersect_intervals, merge_intervals
from fabricpace.importers.kineto_parse import (
    _CPU_KINDS,
    SUFFIXES,
    RankTrace,
    canonical_op,
    is_comm_kernel,
    parse_trace,
    rank_from_name,
)
from fabricpace.importers.staging import list_sources, staged_dir
from fabricpace.run.coverage import job_ranks_missing, job_ranks_text
from fabricpace.run.manifest import Manifest
from fabricpace.run.writer import RunWriter, write_table_atomic

__all__ = [
    "KinetoConfig",
    "build_tables",
    "canonical_op",
    "import_kineto",
    "is_comm_kernel",
    "parse_trace",
    "rank_from_name",
]


@dataclass(frozen=True, kw_only=True)
class KinetoConfig:
    """Options of the Kineto importer."""

    ops: bool = True  # keep GPU kernels/memcpy/memset as ops rows
    gpus_per_node: int | None = None  # node = rank // gpus_per_node when hosts are not known
    chunk_bytes: int = 1 << 20  # read size while streaming
    # Ranks whose steps start further apart than the different-runs limit are one job whose hosts'
    # clocks disagree (no NTP): import them, each rank aligned by its median step-start offset.
    allow_clock_skew: bool = False


@dataclass
class RankTables:
    """One rank's rows as numpy columns, times in absolute ns."""

    rank: int
    steps: dict[str, np.ndarray]
    collectives: dict[str, Any]
    ops: dict[str, Any] | None


def _abs_ns(trace: RankTrace, ts: np.ndarray) -> np.ndarray:
    return trace.base_ns + np.rint(ts * 1000.0).astype(np.int64)


def _assign(starts: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index of the last step started at or before t (-1 before the first); starts are sorted."""
    return np.searchsorted(starts, t, side="right") - 1


def build_tables(trace: RankTrace, *, keep_ops: bool) -> RankTables:
    """Turn one parsed trace into steps / collectives / ops columns (vectorized)."""
    assert trace.rank is not None
    names = np.array(list(trace.names), dtype=object) if trace.names else np.array([], dtype=object)
    s_ts, s_dur, s_num = trace.cpu_steps.arrays()
    order = np.argsort(s_ts, kind="stable")
    s_ts, s_dur, s_num = s_ts[order], s_dur[order], s_num[order]
    keep = s_num >= 0
    s_ts, s_dur, s_num = s_ts[keep], s_dur[keep], s_num[keep]
    t_start, t_end = _abs_ns(trace, s_ts), _abs_ns(trace, s_ts + s_dur)
    nsteps = len(s_num)

    # The window GPU work is assigned by: the GPU step annotation when present, else the CPU step.
    g_ts, _, g_num = trace.gpu_steps.arrays()
    win_start = t_start.copy()
    pos = {int(v): i for i, v in enumerate(g_num)}
    if len(g_num):
        g_abs = _abs_ns(trace, g_ts)
        for i, v in enumerate(s_num):  # one entry per step: tiny loop
            j = pos.get(int(v))
            if j is not None:
                win_start[i] = g_abs[j]
    worder = np.argsort(win_start, kind="stable")

    def step_index(t: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(win_start[worder], t, side="right") - 1
        return np.where(idx >= 0, worder[np.clip(idx, 0, None)], -1)

    k_ts, k_dur, k_name = trace.kernels.arrays()
    c_ts, c_dur, c_name = trace.comm_kernels.arrays()
    c_bytes = np.frombuffer(trace.comm_bytes, dtype=np.int64)
    c_group = np.frombuffer(trace.comm_group, dtype=np.int64)
    gpu_comm = len(c_ts) > 0
    if not gpu_comm:  # CPU-only trace (gloo, or no GPU activity)
        c_ts, c_dur, c_name, c_bytes, c_group = _cpu_collectives(trace)
        step_of_comm = _assign(t_start, _abs_ns(trace, c_ts)) if len(c_ts) else np.zeros(0, int)
    else:
        step_of_comm = step_index(_abs_ns(trace, c_ts))
    c_start, c_end = _abs_ns(trace, c_ts), _abs_ns(trace, c_ts + c_dur)

    # Each component is time inside its step's window: intervals are clipped to the window, so an
    # interval (or a chain of merged ones) that runs past a step's end is not charged whole to the step
    # it started in (a gloo span ending after ProfilerStep#N merged with step N+1's first span gave
    # wait_ns = 108.7 ms in a 51.8 ms step, and 0 in the next). CPU work (collective spans of
    # CPU-only traces, data loading): the CPU step [t_start, t_end); a CPU collective counts only in
    # the step that issued it (DDP waits for its buckets before the step ends: a gloo span closing
    # a few ms into the next step is the worker thread's bookkeeping, not the next step's waiting).
    # GPU work: the windows its steps are assigned by, [window start, next window start), the last
    # to its GPU annotation's end.
    g_start, g_end = _gpu_windows(trace, s_num, t_end, win_start, worder, pos)
    d_ts, d_dur, _ = trace.data.arrays()
    d_start, d_end = merge_intervals(_abs_ns(trace, d_ts), _abs_ns(trace, d_ts + d_dur))
    data_ns = covered_in_windows(t_start, t_end, d_start, d_end)
    comm_ns = np.zeros(nsteps, dtype=np.int64)
    wait_ns = np.zeros(nsteps, dtype=np.int64)
    k_start, k_end = merge_intervals(_abs_ns(trace, k_ts), _abs_ns(trace, k_ts + k_dur))
    if len(c_start):
        m_start, m_end = merge_intervals(c_start, c_end)
        if gpu_comm:  # exposed communication: comm kernels not overlapped by compute kernels
            comm_ns = covered_in_windows(g_start, g_end, m_start, m_end)
            h_start, h_end = intersect_intervals(m_start, m_end, k_start, k_end)
            wait_ns = comm_ns - covered_in_windows(g_start, g_end, h_start, h_end)
        else:  # the step's own collectives in flight while the main thread was not loading data
            m_start, m_end = _own_step_spans(c_start, c_end, step_of_comm, t_start, t_end)
            comm_ns = covered_in_windows(t_start, t_end, m_start, m_end)
            h_start, h_end = intersect_intervals(m_start, m_end, d_start, d_end)
            wait_ns = comm_ns - covered_in_windows(t_start, t_end, h_start, h_end)
    if gpu_comm or (len(k_ts) and not len(c_start)):
        compute_ns = covered_in_windows(g_start, g_end, k_start, k_end)
    else:  # own work (DESIGN.md, the observer's definition): the step less waiting, data and GC (none)
        compute_ns = np.maximum((t_end - t_start) - wait_ns - data_ns, 0)

    steps: dict[str, np.ndarray] = {
        "rank": np.full(nsteps, trace.rank, dtype=np.int32),
        "step": s_num.astype(np.int64),
        "t_start_ns": t_start,
        "t_end_ns": t_end,
        "compute_ns": compute_ns,
        "wait_ns": wait_ns,
        "comm_ns": comm_ns,
        "data_ns": data_ns,
        "gc_ns": np.zeros(nsteps, dtype=np.int64),
        "paced_ns": np.zeros(nsteps, dtype=np.int64),
        "samples": np.full(nsteps, None),
    }
    ok = step_of_comm >= 0
    group_names = names[c_group[ok]] if len(names) else np.array([], dtype=object)
    collectives = {
        "rank": np.full(int(ok.sum()), trace.rank, dtype=np.int32),
        "step": s_num[step_of_comm[ok]].astype(np.int64),
        "group_key": np.array([g[len("group:"):] for g in group_names], dtype=object),
        "op": names[c_name[ok]] if len(names) else np.array([], dtype=object),
        "bytes": np.where(c_bytes[ok] >= 0, c_bytes[ok], 0),
        "bytes_known": c_bytes[ok] >= 0,
        "t_enter_ns": c_start[ok],
        "t_exit_ns": c_end[ok],
    }
    ops = None
    if keep_ops and len(k_ts):
        k_start = _abs_ns(trace, k_ts)
        k_step = step_index(k_start)
        good = k_step >= 0
        ops = {
            "rank": np.full(int(good.sum()), trace.rank, dtype=np.int32),
            "step": s_num[k_step[good]].astype(np.int64),
            # op names stay indices into the trace's name table: a dictionary column, never one
            # string per row (millions of kernels would otherwise be millions of string copies)
            "op_index": k_name[good].astype(np.int32),
            "op_names": list(trace.names),
            "t_start_ns": k_start[good],
            "dur_ns": np.rint(k_dur[good] * 1000.0).astype(np.int64),
        }
    return RankTables(rank=trace.rank, steps=steps, collectives=collectives, ops=ops)


def _own_step_spans(
    start: np.ndarray, end: np.ndarray, step: np.ndarray, t_start: np.ndarray, t_end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The union of the intervals, each first cut to the window of its own step (``step`` indexes
    ``t_start``/``t_end``; -1: before the first step, left out). Windows do not overlap, so the union
    within a window is that step's own intervals only."""
    ok = step >= 0
    s = np.maximum(start[ok], t_start[step[ok]])
    e = np.minimum(end[ok], t_end[step[ok]])
    keep = e > s
    return merge_intervals(s[keep], e[keep])


def _gpu_windows(
    trace: RankTrace, s_num: np.ndarray, t_end: np.ndarray, win_start: np.ndarray, worder: np.ndarray,
    pos: dict[int, int],
) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the window GPU work is counted in: from the step's window start (GPU annotation, else
    CPU start) to the next step's, the last step's to its GPU annotation's end (else its CPU end)."""
    end = t_end.copy()
    g_ts, g_dur, _ = trace.gpu_steps.arrays()
    if len(g_ts):
        g_end = _abs_ns(trace, g_ts + g_dur)
        for i, v in enumerate(s_num):  # one entry per step: tiny loop
            j = pos.get(int(v))
            if j is not None:
                end[i] = g_end[j]
    if len(worder) > 1:
        end[worder[:-1]] = win_start[worder[1:]]
    return win_start, np.maximum(end, win_start)


def _cpu_collectives(trace: RankTrace) -> tuple[np.ndarray, ...]:
    """Collectives of a trace without communication kernels: (ts, dur, name id, bytes, group id).

    gloo runs each collective on a worker thread as ``gloo:*``, from when a worker thread takes it up
    to completion (waiting for peers included). The main thread's issuing op (``record_param_comms``,
    else ``c10d::*``, else ``nccl:*``) carries the metadata (op, bytes, group); when both exist in equal
    numbers they are paired in time order (gloo's queue is first in, first out) and the collective
    runs from the issuing op's start (the rank's arrival: a bucket queued behind busy worker threads
    starts its gloo span only when one is free, 44 ms after it was issued in the audit's traces) to
    the gloo span's end. Unpaired, the gloo spans give both times. Only one kind is ever used per
    collective, so nested wrappers of one collective are not counted twice.
    """

    def cols(kind: str) -> tuple[np.ndarray, ...]:
        ts, dur, name = trace.cpu_comm[kind].arrays()
        order = np.argsort(ts, kind="stable")
        nbytes = np.frombuffer(trace.cpu_comm_bytes[kind], dtype=np.int64)
        group = np.frombuffer(trace.cpu_comm_group[kind], dtype=np.int64)
        return ts[order], dur[order], name[order], nbytes[order], group[order]

    issue = next((k for k in _CPU_KINDS if k != "gloo:" and len(trace.cpu_comm[k].ts)), None)
    if len(trace.cpu_comm["gloo:"].ts):
        ts, dur, name, nbytes, group = cols("gloo:")
        if issue is not None and len(trace.cpu_comm[issue].ts) == len(ts):
            issue_ts, _, name, issue_bytes, group = cols(issue)
            # the issuing op's bytes when it has them, else the gloo span's own (record_shapes)
            nbytes = np.where(issue_bytes >= 0, issue_bytes, nbytes)
            end = ts + dur
            ts = np.minimum(issue_ts, ts)  # a pair issued after its span started is no true pair
            dur = end - ts
        return ts, dur, name, nbytes, group
    if issue is not None:
        return cols(issue)
    empty = np.zeros(0)
    return empty, empty, empty.astype(np.int64), empty.astype(np.int64), empty.astype(np.int64)


def _number_collectives(tables: list[RankTables]) -> None:
    """seq: position within (group, step) in issue order, made global per group as step*stride + idx.

    Every rank issues the same collectives of a group in the same order within a step, so this names
    one instance across ranks even when ranks' traces start at different steps.
    """
    stride: dict[str, int] = {}
    for t in tables:
        c = t.collectives
        n = len(c["rank"])
        idx = np.zeros(n, dtype=np.int64)
        if n:
            order = np.lexsort((c["t_enter_ns"], c["step"], c["group_key"].astype(str)))
            keys = np.char.add(c["group_key"].astype(str)[order], "|" + c["step"].astype(str)[order])
            new = np.r_[True, keys[1:] != keys[:-1]]
            first = np.maximum.accumulate(np.where(new, np.arange(n), 0))
            idx[order] = np.arange(n) - first
            for g in np.unique(c["group_key"].astype(str)):
                sel = c["group_key"].astype(str) == g
                stride[g] = max(stride.get(g, 0), int(idx[sel].max()) + 1)
        c["idx"] = idx
    for t in tables:
        c = t.collectives
        strides = np.array([stride.get(str(g), 1) for g in c["group_key"]], dtype=np.int64)
        c["seq"] = c["step"] * strides + c["idx"]


def import_kineto(
    src: str | Path,
    out: str | Path,
    *,
    config: KinetoConfig = KinetoConfig(),
    progress: Callable[[int], None] | None = None,
    on_total: Callable[[int], None] | None = None,
) -> Path:
    """Import SRC (a trace file or a folder of per-rank traces) into the new run directory OUT."""
    files = list_sources(src, SUFFIXES, what="Kineto trace")
    if on_total is not None:
        on_total(sum(p.stat().st_size for p in files))
    with staged_dir(out) as tmp:
        ranks_seen: dict[int, list[Path]] = {}
        pids: dict[int, int | None] = {}
        world_sizes: dict[int, Path] = {}
        hosts: dict[int, str | None] = {}
        writer = RunWriter(tmp, Manifest(source="import:kineto", world_size=len(files), nodes=1,
                                         gpus_per_node=len(files)))
        origin: int | None = None
        stats = {"events": 0, "collectives": 0, "ops": 0, "gpu_collectives": False}
        by_rank: dict[int, RankTables] = {}
        for path in files:
            trace = parse_trace(path, progress=_progress_in_compressed(path, progress))
            assert trace.rank is not None
            if trace.world_size is not None:
                if world_sizes and trace.world_size not in world_sizes:
                    other, other_path = next(iter(world_sizes.items()))
                    raise RunDirError(
                        f"{src}: traces of different jobs ({other_path.name}: world_size {other}, "
                        f"{path.name}: world_size {trace.world_size}); import one job at a time "
                        "(move the other job's files to their own folder)"
                    )
                world_sizes.setdefault(trace.world_size, path)
            tables = build_tables(trace, keep_ops=config.ops)
            prev = by_rank.get(trace.rank)
            if prev is not None:
                # Several files of one rank: the profiler's cycles (schedule repeat > 1) of one
                # process are merged; anything else is another run's trace of this rank.
                _check_same_process(src, trace.rank, ranks_seen[trace.rank][-1], path,
                                    pids[trace.rank], trace.pid, prev, tables)
            ranks_seen.setdefault(trace.rank, []).append(path)
            pids.setdefault(trace.rank, trace.pid)
            hosts.setdefault(trace.rank, trace.host)
            stats["events"] += trace.events
            stats["gpu_collectives"] = stats["gpu_collectives"] or len(trace.comm_kernels.ts) > 0
            first = int(tables.steps["t_start_ns"].min())
            origin = first if origin is None else min(origin, first)
            if tables.ops is not None:  # ops can be large: write now, shift when finalizing
                _write_ops(tmp, tables.rank, tables.ops, part=len(ranks_seen[trace.rank]) - 1)
                stats["ops"] += len(tables.ops["rank"])
                tables.ops = None
            by_rank[trace.rank] = tables if prev is None else _concat(prev, tables)
            del trace
        all_tables = [by_rank[r] for r in sorted(by_rank)]
        assert origin is not None
        offsets = _check_one_run(src, all_tables, ranks_seen, allow_skew=config.allow_clock_skew)
        if config.allow_clock_skew:  # the origin on the aligned clocks: the first aligned step start
            origin = min(int(t.steps["t_start_ns"].min()) - offsets[t.rank] for t in all_tables)
        _number_collectives(all_tables)
        for t in all_tables:
            shift = origin + offsets[t.rank]
            st = dict(t.steps)
            st["t_start_ns"] = st["t_start_ns"] - shift
            st["t_end_ns"] = st["t_end_ns"] - shift
            writer.write("steps", st, rank=t.rank)
            c = t.collectives
            if len(c["rank"]):
                writer.write("collectives", {
                    "rank": c["rank"], "step": c["step"], "seq": c["seq"],
                    "group": c["group_key"].astype(str), "op": c["op"].astype(str),
                    "bytes": np.where(c["bytes_known"], c["bytes"], None),
                    "t_enter_ns": c["t_enter_ns"] - shift, "t_exit_ns": c["t_exit_ns"] - shift,
                }, rank=t.rank)
                stats["collectives"] += len(c["rank"])
        _shift_ops(tmp, origin, offsets)
        rank_ids = sorted(ranks_seen)
        host_names = [hosts[r] for r in rank_ids]
        if all(h is not None for h in host_names):
            order = list(dict.fromkeys(host_names))
            node: list[int | None] = [order.index(h) for h in host_names]
        elif config.gpus_per_node:
            node = [r // config.gpus_per_node for r in rank_ids]
        else:
            node = [None] * len(rank_ids)
        nodes = len({n for n in node if n is not None}) or 1
        per_node = math.ceil(len(rank_ids) / nodes)
        writer.write("ranks", {
            "rank": rank_ids, "node": node,
            "local_rank": _local_ranks(node),
            "host": host_names, "leaf": [None] * len(rank_ids), "dp_rank": rank_ids,
            "pp_stage": [None] * len(rank_ids), "tp_rank": [None] * len(rank_ids),
            "numa": [None] * len(rank_ids), "gpu": [None] * len(rank_ids), "nic": [None] * len(rank_ids),
            "clock_offset_ns": [offsets[r] for r in rank_ids], "clock_err_ns": [None] * len(rank_ids),
            "trace_file": [", ".join(p.name for p in ranks_seen[r]) for r in rank_ids],
        })
        node_from = "unknown"
        if node[0] is not None:
            node_from = "host names (trace host_name or file name)" if all(host_names) else "--gpus-per-node"
        writer.manifest.world_size = len(rank_ids)
        writer.manifest.nodes = nodes
        writer.manifest.gpus_per_node = per_node
        writer.manifest.workload = {"name": "kineto import"}
        writer.close(
            import_format="kineto",
            sources=[str(p) for p in files],
            job_world_size=max(world_sizes) if world_sizes else None,
            profiler_cycles=max(len(v) for v in ranks_seen.values()),
            origin_abs_ns=origin,
            collectives_from="gpu kernels" if stats["gpu_collectives"] else "cpu ops",
            events=stats["events"],
            node_from=node_from,
            **({"clock_aligned_by": "median step-start offset (--allow-clock-skew)"}
               if config.allow_clock_skew else {}),
        )
    job = max(world_sizes) if world_sizes else None
    missing = job_ranks_missing(rank_ids, job)
    if missing:  # told once, on stderr; readers of the run warn again (run/coverage.py)
        print(f"note: {src}: distributedInfo.world_size is {job}: {job_ranks_text(missing, job)}",
              file=sys.stderr)
    return Path(out)


RUN_APART_STEPS = 10  # ranks' starts of one ProfilerStep#N further apart than this many median steps
RUN_APART_MIN_NS = 1_000_000_000  # ... and than this: traces of different runs


def _check_one_run(src: str | Path, tables: list[RankTables], files: dict[int, list[Path]], *,
                   allow_skew: bool = False) -> dict[int, int]:
    """Refuse ranks whose steps start far from the same steps of the other ranks: other runs' traces.

    One job's ranks run the same step together (a collective joins them every step): rank r's
    ProfilerStep#N starts within a step or so of rank 0's, plus the hosts' clock skew (milliseconds).
    Per rank, the offset is the median over the steps it shares with the first rank before it that
    shares any (the lowest rank first), of its start minus that rank's start; a median, so one odd
    step (a stall, a checkpoint) moves nothing. More than max(10 median step lengths, 1 s) apart is
    refused: the audit's folder mixing two runs of 50 ms steps had them 20.2 s apart.

    With ``allow_skew`` the user says the ranks are one job on hosts whose clocks disagree: nothing is
    refused, and each rank's offset to rank 0's clock (its median offset chained through its reference
    rank's) is returned, to be taken off its times. Without it every offset returned is 0: clocks are
    taken as synchronized, as before.
    """
    starts = {t.rank: dict(zip(t.steps["step"].tolist(), t.steps["t_start_ns"].tolist(), strict=True))
              for t in tables}
    lengths = np.concatenate([t.steps["t_end_ns"] - t.steps["t_start_ns"] for t in tables])
    limit = max(RUN_APART_STEPS * float(np.median(lengths)), RUN_APART_MIN_NS) if len(lengths) else 0.0
    checked: list[int] = []
    offsets = dict.fromkeys(starts, 0)
    for rank in sorted(starts):
        for ref in checked:
            shared = sorted(starts[rank].keys() & starts[ref].keys())
            if not shared:
                continue
            diffs = np.array([starts[rank][n] - starts[ref][n] for n in shared], dtype=np.float64)
            off = float(np.median(diffs))
            if allow_skew:
                offsets[rank] = offsets[ref] + round(off)
            elif abs(off) > limit:
                n = shared[len(shared) // 2]
                raise RunDirError(
                    f"{src}: traces of different runs: ProfilerStep#{n} of rank {rank} "
                    f"({_names(files[rank])}) starts {abs(off) / 1e9:.1f} s "
                    f"{'after' if off > 0 else 'before'} that of rank {ref} "
                    f"({_names(files[ref])}), with steps of {float(np.median(lengths)) / 1e6:.0f} ms (one "
                    "job's ranks start each step together, unless its hosts' clocks disagree by that much); "
                    "import one run at a time (move the other run's files to their own folder), or, "
                    "if they are one job on hosts whose clocks disagree, pass --allow-clock-skew"
                )
            break
        checked.append(rank)
    return offsets


def _names(paths: list[Path]) -> str:
    return paths[0].name + (f" and {len(paths) - 1} more" if len(paths) > 1 else "")


def _check_same_process(
    src: str | Path, rank: int, first: Path, path: Path, pid_a: int | None, pid_b: int | None,
    a: RankTables, b: RankTables,
) -> None:
    """Refuse a second trace of ``rank`` unless it is another profiler cycle of the same process."""
    steps_a, steps_b = set(a.steps["step"].tolist()), set(b.steps["step"].tolist())
    shared = sorted(steps_a & steps_b)
    if pid_a is not None and pid_b is not None and pid_a != pid_b:
        why = f"processes {pid_a} and {pid_b}"
    elif shared:
        why = f"both hold ProfilerStep#{shared[0]}"
    else:
        return
    raise RunDirError(
        f"{src}: rank {rank} appears twice ({first.name} and {path.name}; {why}): traces of different "
        "runs; import one run at a time (move the other run's files to their own folder)"
    )


def _concat(a: RankTables, b: RankTables) -> RankTables:
    """One rank's tables from two profiler cycles (disjoint steps), steps in step order."""
    steps = {k: np.concatenate([a.steps[k], b.steps[k]]) for k in a.steps}
    order = np.argsort(steps["step"], kind="stable")
    steps = {k: v[order] for k, v in steps.items()}
    coll = {k: np.concatenate([a.collectives[k], b.collectives[k]]) for k in a.collectives}
    return RankTables(rank=a.rank, steps=steps, collectives=coll, ops=None)


def _local_ranks(node: list[int | None]) -> list[int | None]:
    """Position of each rank among the ranks of its node (null when nodes are unknown)."""
    seen: dict[int, int] = {}
    out: list[int | None] = []
    for n in node:
        if n is None:
            out.append(None)
            continue
        out.append(seen.get(n, 0))
        seen[n] = seen.get(n, 0) + 1
    return out


def _progress_in_compressed(
    path: Path, progress: Callable[[int], None] | None
) -> Callable[[int], None] | None:
    """Progress is counted in bytes on disk: scale decompressed bytes by the file's compression ratio."""
    if progress is None or not path.name.endswith(".gz"):
        return progress
    size = path.stat().st_size
    try:
        with path.open("rb") as fh:  # ISIZE: uncompressed size mod 2**32 in the last 4 bytes
            fh.seek(-4, 2)
            isize = int.from_bytes(fh.read(4), "little")
    except OSError:
        return progress
    ratio = size / isize if isize > size else 1.0

    def scaled(n: int) -> None:
        progress(int(n * ratio))

    return scaled


def _write_ops(run_dir: Path, rank: int, ops: dict[str, Any], *, part: int = 0) -> None:
    """One rank's ops as a Parquet part with a dictionary-encoded op column (same layout as RunWriter)."""
    table = pa.table({
        "rank": pa.array(ops["rank"], pa.int32()),
        "step": pa.array(ops["step"], pa.int64()),
        "op": pa.DictionaryArray.from_arrays(pa.array(ops["op_index"], pa.int32()),
                                             pa.array(ops["op_names"], pa.string())),
        "t_start_ns": pa.array(ops["t_start_ns"], pa.int64()),
        "dur_ns": pa.array(ops["dur_ns"], pa.int64()),
    })
    write_table_atomic(run_dir / "ops" / f"rank-{rank:05d}" / f"part-{part:06d}.parquet", table)


def _shift_ops(run_dir: Path, origin: int, offsets: dict[int, int]) -> None:
    """Move the ops parts (written in absolute ns to keep memory bounded) onto the run's timeline:
    ``origin`` plus the rank's clock offset (its folder's name says the rank)."""
    folder = run_dir / "ops"
    if not folder.is_dir():
        return
    for part in sorted(folder.glob("*/part-*.parquet")):
        shift = origin + offsets.get(int(part.parent.name.removeprefix("rank-")), 0)
        t = pq.read_table(part)
        i = t.schema.get_field_index("t_start_ns")
        t = t.set_column(i, "t_start_ns", pc.subtract(t.column(i), pa.scalar(shift, pa.int64())))
        tmp = part.with_name("." + part.name + ".tmp")
        pq.write_table(t, tmp, compression="zstd")
        tmp.replace(part)
