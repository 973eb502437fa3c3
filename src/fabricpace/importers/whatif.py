"""Import the per-op traces of ByteDance's What-if straggler analysis (OSDI'25 artifact) into a run directory.

Input: a Parquet file with one row per recorded op — ``dp_rank, stage, rank, step, optype, start_ts,
duration, seq_id, mc, gmc, mb_id`` (times in seconds; optional ``tp_rank``, ``transfer_duration``) —
and the job's meta YAML beside it (``meta-<name>.yaml`` for ``trace-<name>.parquet``, or the one
``*.yaml`` in the folder) with ``dp_size, pp_size, tp_size, world_size``.

A *worker* is a (dp_rank, stage) pair: one tensor-parallel group of ranks shares it, so it becomes one
fabricpace rank, ``rank = stage · dp_size + dp_rank`` (rows of other TP ranks of the same worker, if
present, are dropped; the lowest global rank is kept as ``global_rank``). Collectives:

- data-parallel ops (``grads-reduce-scatter``, ``params-all-gather``, ``separate-grads-all-reduce``,
  ``layernorm-grads-all-reduce``, ...) over the workers of one stage (group ``dp-stage<s>``);
- ``embedding-grads-all-reduce`` between the first and last stage of one DP rank (``emb-dp<d>``);
- pipeline sends/receives as two-party instances: ``forward-send`` at stage s with ``forward-recv`` at
  s+1, ``backward-send`` at s with ``backward-recv`` at s−1 (group ``pp-dp<d>-<a>-<b>``).

Instances are matched by (step, optype, model chunk, seq_id), which all members record alike.
Step components: compute = forward/backward compute plus the optimizer's own time; wait = comm =
time in blocking communication ops (Megatron's timers measure the blocking call); data = data
loading. Traces whose timestamps restart every step are laid out back to back (as the artifact's own
``--reset-step-start`` does).
"""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fabricpace._errors import ConfigError, InputError, ParseError, RunDirError
from fabricpace.importers.staging import staged_dir
from fabricpace.run.manifest import Manifest
from fabricpace.run.writer import RunWriter

REQUIRED = (
    "dp_rank",
    "stage",
    "rank",
    "step",
    "optype",
    "start_ts",
    "duration",
    "seq_id",
    "mc",
    "gmc",
    "mb_id",
)
DP_COLLECTIVES = {
    "grads-reduce-scatter": "reduce_scatter",
    "grads-reduce-scatter-nonoverlapping": "reduce_scatter",
    "params-all-gather": "all_gather",
    "params-all-gather-nonoverlapping": "all_gather",
    "separate-grads-all-reduce": "all_reduce",
    "grads-all-reduce": "all_reduce",
    "layernorm-grads-all-reduce": "all_reduce",
}
EMBEDDING = "embedding-grads-all-reduce"
P2P = {
    "forward-send": (1, "fwd"),
    "forward-recv": (0, "fwd"),
    "backward-send": (-1, "bwd"),
    "backward-recv": (0, "bwd"),
}
COMPUTE = ("forward-compute", "backward-compute", "backward-wgrad-compute", "loss-compute", "post-process")
DATA = ("data-load", "batch-generator", "data-sync")
GC = ("gc",)
# Blocking communication (pipeline, tensor- and data-parallel), after the artifact's own grouping.
COMM = (
    "forward-send",
    "backward-send",
    "forward-recv",
    "backward-recv",
    "forward-send-backward-recv",
    "backward-send-forward-recv",
    "forward-send-forward-recv",
    "backward-send-backward-recv",
    "forward-backward-send-forward-backward-recv",
    "tp-reducescatter",
    "tp-allgather",
    "tp-allreduce",
    *DP_COLLECTIVES,
    EMBEDDING,
    "optimizer-clip-main-grad",
)
NS = 1e9


class WhatIfMeta(BaseModel):
    """The meta YAML of a What-if trace."""

    model_config = ConfigDict(extra="allow")

    trial_name: str | None = None
    dp_size: int = Field(gt=0)
    pp_size: int = Field(gt=0)
    tp_size: int = Field(default=1, gt=0)
    dsp_size: int = Field(default=1, gt=0)
    vpp_size: int = Field(default=1, gt=0)
    world_size: int = Field(gt=0)

    @model_validator(mode="after")
    def _sizes_agree(self) -> WhatIfMeta:
        if self.world_size != self.dp_size * self.pp_size * self.tp_size * self.dsp_size:
            raise ValueError("world_size must equal dp_size × pp_size × tp_size × dsp_size")
        return self


def find_inputs(src: str | Path, meta: str | Path | None) -> tuple[Path, Path]:
    """(parquet, meta yaml) from SRC (a .parquet file or a folder with one) and an optional --meta."""
    path = Path(src)
    if not path.exists():
        raise InputError(f"{path}: does not exist; pass the What-if trace .parquet or its folder")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if not p.name.startswith("."))
        if not files:
            raise RunDirError(f"{path}: empty folder; expected a What-if trace .parquet and its meta .yaml")
        parquets = [p for p in files if p.suffix == ".parquet"]
        others = [p for p in files if p.suffix not in (".parquet", ".yaml", ".yml")]
        if len(parquets) != 1 or others:
            what = others[0].name if others else f"{len(parquets)} .parquet files"
            raise RunDirError(f"{path}: mixed folder ({what}); pass the trace .parquet itself and --meta")
        trace = parquets[0]
    else:
        if path.suffix != ".parquet":
            raise InputError(f"{path}: expected a What-if trace ending in .parquet")
        trace = path
    if meta is not None:
        if not Path(meta).is_file():
            raise InputError(f"--meta {meta}: no such file")
        return trace, Path(meta)
    stem = trace.stem
    guesses = [trace.with_name(stem.replace("trace-", "meta-", 1) + ".yaml"), trace.with_name("meta.yaml")]
    for g in guesses:
        if g.is_file():
            return trace, g
    yamls = sorted(trace.parent.glob("*.yaml"))
    if len(yamls) == 1:
        return trace, yamls[0]
    raise InputError(
        f"{trace}: no meta YAML found beside it (looked for {guesses[0].name}, meta.yaml); pass --meta FILE"
    )


def load_meta(path: Path) -> WhatIfMeta:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: unreadable YAML ({exc})") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with dp_size, pp_size, tp_size, world_size")
    try:
        return WhatIfMeta.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(file)"
        raise ConfigError(f"{path}: field {field}: {err['msg']}") from exc


def load_trace(path: Path) -> pl.DataFrame:
    """Read and check the Parquet: required columns present and without nulls where they matter."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise ParseError(f"{path}: not a readable Parquet file ({exc})") from exc
    missing = [c for c in REQUIRED if c not in table.column_names]
    if missing:
        raise ParseError(
            f"{path}: missing column(s) {', '.join(missing)}; a What-if trace has {', '.join(REQUIRED)}"
        )
    df = pl.DataFrame(pl.from_arrow(table))
    if df.height == 0:
        raise ParseError(f"{path}: no rows")
    for c in ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration"):
        n = df[c].null_count()
        if n:
            raise ParseError(f"{path}: column {c} has {n} null value(s); every op needs it")
    try:
        return df.with_columns(
            pl.col("dp_rank", "stage", "rank", "step").cast(pl.Int64),
            pl.col("seq_id", "mc", "gmc", "mb_id").cast(pl.Int64, strict=False),
            pl.col("optype").cast(pl.String),
            pl.col("start_ts", "duration").cast(pl.Float64),
        )
    except pl.exceptions.PolarsError as exc:
        raise ParseError(f"{path}: a column has the wrong type ({exc})") from exc


def _check_against_meta(df: pl.DataFrame, meta: WhatIfMeta, trace: Path, meta_path: Path) -> None:
    dp_max, pp_max = int(df["dp_rank"].max()), int(df["stage"].max())  # type: ignore[arg-type]
    if dp_max >= meta.dp_size or pp_max >= meta.pp_size or int(df["dp_rank"].min()) < 0:  # type: ignore[arg-type]
        raise ParseError(
            f"{trace}: dp_rank up to {dp_max} / stage up to {pp_max} do not fit dp_size {meta.dp_size} / "
            f"pp_size {meta.pp_size} of {meta_path}; is it the meta of another job?"
        )


def _restarts_every_step(df: pl.DataFrame) -> bool:
    """Whether time restarts every step: per worker (dp_rank, stage), step s+1 starts before the middle
    of that worker's own step s, in most of its consecutive steps.

    Per worker, not across workers: in pipeline parallelism one stage starts step s+1 while another
    still finishes step s (the last stage ends its backward first), so steps of different workers
    overlap in any absolute-time trace (the audit's GPipe trace: stage 1 started 20 ms before stage 0
    ended). A worker's own step s+1 never starts before its step s is half done unless the clock
    restarted; "most" tolerates a step whose ops overlap the next one's (a prefetch)."""
    per = (
        df.group_by("dp_rank", "stage", "step")
        .agg(pl.col("t0").min().alias("lo"), pl.col("t1").max().alias("hi"))
        .sort("dp_rank", "stage", "step")
        .with_columns(pl.col("lo").shift(-1).over("dp_rank", "stage").alias("next_lo"))
        .drop_nulls("next_lo")
    )
    if per.height == 0:
        return False
    restart = per["next_lo"] < (per["lo"] + per["hi"]) // 2
    return bool(restart.mean() > 0.5)  # type: ignore[operator]


def _timeline(df: pl.DataFrame) -> tuple[pl.DataFrame, bool]:
    """Absolute ns columns; steps laid out back to back when the trace restarts time every step."""
    df = df.with_columns(
        (pl.col("start_ts") * NS).round().cast(pl.Int64).alias("t0"),
        ((pl.col("start_ts") + pl.col("duration")) * NS).round().cast(pl.Int64).alias("t1"),
    )
    span = (
        df.group_by("step").agg(pl.col("t0").min().alias("lo"), pl.col("t1").max().alias("hi")).sort("step")
    )
    relative = _restarts_every_step(df)
    if relative:
        lo, hi = span["lo"].to_numpy(), span["hi"].to_numpy()
        lengths = hi - lo
        starts = [0]
        for length in lengths[:-1]:  # one entry per step
            starts.append(starts[-1] + int(length))
        shift = pl.DataFrame({"step": span["step"], "shift": pl.Series(starts, dtype=pl.Int64) - span["lo"]})
        df = df.join(shift, on="step").with_columns(
            pl.col("t0") + pl.col("shift"), pl.col("t1") + pl.col("shift")
        )
    origin = int(df["t0"].min())  # type: ignore[arg-type]
    return df.with_columns(pl.col("t0") - origin, pl.col("t1") - origin), relative


def _instances(df: pl.DataFrame, dp_size: int, pp_size: int) -> pl.DataFrame:
    """Collective rows (rank, step, seq, group, op, t_enter_ns, t_exit_ns) for DP, embedding and P2P ops."""
    key = [pl.col("step"), pl.col("optype"), pl.col("mc").fill_null(-1), pl.col("seq_id").fill_null(-1)]
    dp = df.filter(pl.col("optype").is_in(list(DP_COLLECTIVES))).with_columns(
        pl.format("dp-stage{}", pl.col("stage")).alias("group"),
        pl.col("optype").replace_strict(DP_COLLECTIVES, default="other").alias("op"),
    )
    emb = df.filter(pl.col("optype") == EMBEDDING).with_columns(
        pl.format("emb-dp{}", pl.col("dp_rank")).alias("group"), pl.lit("all_reduce").alias("op")
    )
    p2p = df.filter(pl.col("optype").is_in(list(P2P)))
    if p2p.height and pp_size > 1:
        delta = pl.col("optype").replace_strict({k: v[0] for k, v in P2P.items()}, return_dtype=pl.Int64)
        tag = pl.col("optype").replace_strict({k: v[1] for k, v in P2P.items()}, return_dtype=pl.String)
        peer = (pl.col("stage") + delta) % pp_size
        # A send at s pairs with the receive at s ± 1: name the pair (lower, upper) and the direction.
        is_send = pl.col("optype").str.ends_with("-send")
        src = (
            pl.when(is_send)
            .then(pl.col("stage"))
            .otherwise((pl.col("stage") - pl.when(tag == "fwd").then(1).otherwise(-1)) % pp_size)
        )
        dst = pl.when(is_send).then(peer).otherwise(pl.col("stage"))
        p2p = p2p.with_columns(
            pl.format("pp-dp{}-{}-{}", pl.col("dp_rank"), src, dst).alias("group"),
            pl.lit("send_recv").alias("op"),
            tag.alias("dir"),
        )
        key_p2p = [pl.col("step"), pl.col("dir"), pl.col("mc").fill_null(-1), pl.col("seq_id").fill_null(-1)]
        p2p = p2p.with_columns(pl.struct(key_p2p).rank("dense").over("group").cast(pl.Int64).alias("seq") - 1)
        p2p = p2p.drop("dir")
    else:
        p2p = p2p.clear().with_columns(
            pl.lit("").alias("group"), pl.lit("").alias("op"), pl.lit(0).alias("seq")
        )
    coll = (
        pl.concat([dp, emb], how="vertical_relaxed")
        if dp.height or emb.height
        else dp.with_columns(pl.lit("").alias("group"), pl.lit("").alias("op"))
    )
    coll = coll.with_columns(pl.struct(key).rank("dense").over("group").cast(pl.Int64).alias("seq") - 1)
    cols = ["rank_id", "step", "seq", "group", "op", "t0", "t1"]
    both = pl.concat([coll.select(cols), p2p.select(cols)], how="vertical_relaxed")
    return both.rename({"rank_id": "rank", "t0": "t_enter_ns", "t1": "t_exit_ns"})


def _steps(df: pl.DataFrame) -> pl.DataFrame:
    dur = pl.col("t1") - pl.col("t0")

    def total(names: tuple[str, ...]) -> pl.Expr:
        return dur.filter(pl.col("optype").is_in(list(names))).sum()

    opt_children = pl.col("optype").str.starts_with("optimizer-")
    return (
        df.group_by(["rank_id", "step"])
        .agg(
            pl.col("t0").min().alias("t_start_ns"),
            pl.col("t1").max().alias("t_end_ns"),
            (
                total(COMPUTE)
                + (dur.filter(pl.col("optype") == "optimizer").sum() - dur.filter(opt_children).sum()).clip(
                    lower_bound=0
                )
            ).alias("compute_ns"),
            total(COMM).alias("wait_ns"),
            total(DATA).alias("data_ns"),
            total(GC).alias("gc_ns"),
        )
        .with_columns(
            pl.col("wait_ns").alias("comm_ns"),
            pl.lit(0).alias("paced_ns"),
            pl.lit(None, dtype=pl.Int64).alias("samples"),
        )
        .rename({"rank_id": "rank"})
        .sort(["rank", "step"])
    )


def import_whatif(
    src: str | Path,
    out: str | Path,
    *,
    meta: str | Path | None = None,
    gpus_per_node: int | None = None,
) -> Path:
    """Import a What-if trace (+ meta YAML) into the new run directory OUT."""
    trace_path, meta_path = find_inputs(src, meta)
    m = load_meta(meta_path)
    df = load_trace(trace_path)
    _check_against_meta(df, m, trace_path, meta_path)
    # One TP group shares a worker: keep the lowest global rank's rows of each (dp_rank, stage).
    first = df.group_by(["dp_rank", "stage"]).agg(pl.col("rank").min().alias("global_rank"))
    df = df.join(first, on=["dp_rank", "stage"]).filter(pl.col("rank") == pl.col("global_rank"))
    df = df.with_columns((pl.col("stage") * m.dp_size + pl.col("dp_rank")).cast(pl.Int32).alias("rank_id"))
    df, relative = _timeline(df)
    gpn = gpus_per_node or 8
    workers = first.with_columns((pl.col("stage") * m.dp_size + pl.col("dp_rank")).alias("rank")).sort("rank")
    node = (workers["global_rank"] // gpn).to_list()
    n = workers.height
    how = "--gpus-per-node" if gpus_per_node else "assumed 8 GPUs per node"
    with staged_dir(out) as tmp:
        w = RunWriter(
            tmp,
            Manifest(
                source="import:whatif",
                world_size=n,
                nodes=max(1, math.ceil(m.world_size / gpn)),
                gpus_per_node=gpn,
                workload={"name": m.trial_name or trace_path.stem},
            ),
        )
        w.write(
            "ranks",
            {
                "rank": workers["rank"].to_list(),
                "node": node,
                "local_rank": [None] * n,
                "host": [None] * n,
                "leaf": [None] * n,
                "dp_rank": workers["dp_rank"].to_list(),
                "pp_stage": workers["stage"].to_list(),
                "tp_rank": [None] * n,
                "numa": [None] * n,
                "gpu": [None] * n,
                "nic": [None] * n,
                "clock_offset_ns": [0] * n,
                "clock_err_ns": [None] * n,
                "global_rank": workers["global_rank"].to_list(),
            },
        )
        steps = _steps(df)
        for (r,), part in steps.group_by(["rank"]):
            w.write("steps", part.to_dict(as_series=False), rank=int(r))  # type: ignore[arg-type]
        coll = _instances(df, m.dp_size, m.pp_size)
        for (r,), part in coll.group_by(["rank"]):
            cols = part.to_dict(as_series=False)
            cols["bytes"] = [None] * part.height
            w.write("collectives", cols, rank=int(r))  # type: ignore[arg-type]
        ops = df.select(
            pl.col("rank_id").alias("rank"),
            "step",
            pl.col("optype").alias("op"),
            pl.col("t0").alias("t_start_ns"),
            (pl.col("t1") - pl.col("t0")).alias("dur_ns"),
            "stage",
            "dp_rank",
            "mb_id",
            "mc",
            "gmc",
            "seq_id",
        )
        for (r,), part in ops.group_by(["rank"]):
            w.write("ops", part.to_dict(as_series=False), rank=int(r))  # type: ignore[arg-type]
        w.close(
            import_format="whatif",
            sources=[str(trace_path), str(meta_path)],
            meta=m.model_dump(),
            workers=n,
            steps_relative_time=relative,
            node_from=f"global rank // {gpn} ({how})",
        )
    return Path(out)
