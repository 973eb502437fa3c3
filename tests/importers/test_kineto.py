"""Kineto importer: real trace layout (gzip/plain, with/without distributedInfo); bad input via the CLI."""

from __future__ import annotations

import gzip
import json
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from fabricpace._errors import ParseError
from fabricpace.importers.kineto import (
    canonical_op,
    import_kineto,
    is_comm_kernel,
    parse_trace,
    rank_from_name,
)
from fabricpace.importers.synthetic import SyntheticJob, write_job
from fabricpace.run import load_run


def _check_small_job(run_dir: Path, SMALL: SyntheticJob) -> None:
    run = load_run(run_dir)
    assert run.manifest.source == "import:kineto"
    assert run.manifest.complete
    assert run.world_size == SMALL.world_size
    assert run.steps.height == SMALL.world_size * SMALL.steps
    assert sorted(run.steps["step"].unique().to_list()) == list(
        range(SMALL.first_step, SMALL.first_step + SMALL.steps)
    )
    c = run.collectives
    assert c.height == SMALL.world_size * SMALL.steps * SMALL.buckets_per_step
    assert set(c["op"].to_list()) == {"all_reduce"}
    assert set(c["bytes"].to_list()) == {SMALL.bucket_nelems * 2}  # bf16
    # (group, seq) names one instance across ranks: every instance has all four ranks
    sizes = c.group_by(["group", "seq"]).len()
    assert sizes["len"].to_list() == [SMALL.world_size] * sizes.height
    # Every rank leaves a collective together, so exits agree within rounding across ranks.
    spread = c.group_by(["group", "seq"]).agg(
        (pl.col("t_exit_ns").max() - pl.col("t_exit_ns").min()).alias("d")
    )
    assert spread["d"].max() <= 2
    # The slow rank arrives last at the first bucket of every step and waits least.
    first_bucket = c.filter(pl.col("seq") % SMALL.buckets_per_step == 0)
    last = first_bucket.sort("t_enter_ns").group_by(["group", "seq"]).agg(pl.col("rank").last())
    assert set(last["rank"].to_list()) == {SMALL.slow_rank}
    w = run.steps.group_by("rank").agg(pl.col("wait_ns").mean(), pl.col("compute_ns").mean()).sort("rank")
    waits, computes = w["wait_ns"].to_numpy(), w["compute_ns"].to_numpy()
    assert int(np.argmin(waits)) == SMALL.slow_rank
    assert int(np.argmax(computes)) == SMALL.slow_rank
    # Compute from the kernels matches the generator's per-rank compute within the kernel gaps.
    expect = SMALL.compute_us().mean(axis=1) * 1000.0
    assert np.allclose(computes, expect, rtol=0.05)
    # Time starts at 0 on the run's timeline
    assert run.steps["t_start_ns"].min() == 0
    assert run.ops.height == SMALL.world_size * SMALL.steps * SMALL.kernels_per_step


def test_gzip_with_distributed_info(kineto_gz: Path, small_job: SyntheticJob, tmp_path: Path) -> None:
    out = import_kineto(kineto_gz, tmp_path / "run")
    _check_small_job(out, small_job)
    assert load_run(out).manifest.extra["collectives_from"] == "gpu kernels"


def test_plain_json_without_distributed_info_takes_rank_from_file_name(
    kineto_plain_noinfo: Path, small_job: SyntheticJob, tmp_path: Path
) -> None:
    out = import_kineto(kineto_plain_noinfo, tmp_path / "run")
    _check_small_job(out, small_job)
    ranks = load_run(out).ranks
    assert ranks["trace_file"].to_list()[2] == "trace_rank-2.pt.trace.json"


def test_tensorboard_handler_names_give_hosts_and_nodes(tmp_path: Path) -> None:
    job = SyntheticJob(world_size=4, steps=3, kernels_per_step=3)
    src = tmp_path / "tb"
    src.mkdir()
    for r in range(4):  # tensorboard_trace_handler: {host}_{pid}.{ms}.pt.trace.json
        text = (write_job(tmp_path / "tmp", job)[r]).read_text()
        (src / f"node{r // 2}-gpu_{1000 + r}.1780000000000.pt.trace.json").write_text(text)
    run = load_run(import_kineto(src, tmp_path / "run"))
    assert run.ranks.sort("rank")["node"].to_list() == [0, 0, 1, 1]
    assert run.ranks.sort("rank")["host"].to_list() == ["node0-gpu", "node0-gpu", "node1-gpu", "node1-gpu"]
    assert run.manifest.nodes == 2 and run.manifest.gpus_per_node == 2


def test_cpu_only_gloo_trace_counts_each_collective_once(tmp_path: Path) -> None:
    """No GPU kernels: gloo spans give the times, record_param_comms the metadata; no double count."""
    events = []
    for step in range(3):
        t0 = 1000.0 + step * 10_000.0
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step}",
                "pid": 1,
                "tid": 1,
                "ts": t0,
                "dur": 9_000.0,
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "c10d::allreduce_",
                "pid": 1,
                "tid": 1,
                "ts": t0 + 6_000.0,
                "dur": 2_000.0,
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "record_param_comms",
                "pid": 1,
                "tid": 1,
                "ts": t0 + 6_001.0,
                "dur": 1_990.0,
                "args": {
                    "Collective name": "allreduce",
                    "dtype": "Float",
                    "In msg nelems": 256,
                    "Out msg nelems": 256,
                    "Process Group Name": "0",
                },
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "gloo:all_reduce",
                "pid": 1,
                "tid": 7,
                "ts": t0 + 6_002.0,
                "dur": 1_900.0,
            }
        )
    for r in range(2):
        doc = {
            "schemaVersion": 1,
            "distributedInfo": {"backend": "gloo", "rank": r, "world_size": 2},
            "traceEvents": events,
            "baseTimeNanoseconds": 5_000_000_000,
        }
        (tmp_path / f"r{r}.json").write_text(json.dumps(doc))
    (tmp_path / "src").mkdir()
    for r in range(2):
        shutil.move(tmp_path / f"r{r}.json", tmp_path / "src" / f"r{r}.json")
    run = load_run(import_kineto(tmp_path / "src", tmp_path / "run"))
    assert run.collectives.height == 2 * 3
    assert set(run.collectives["bytes"].to_list()) == {1024}
    assert run.manifest.extra["collectives_from"] == "cpu ops"
    s = run.steps.sort(["rank", "step"])
    # issue (record_param_comms starts at +6.001 ms) to the gloo span's end (+7.902 ms), counted once;
    # bytes from record_param_comms
    assert s["wait_ns"].to_list()[0] == 1_901_000
    assert s["compute_ns"].to_list()[0] == 9_000_000 - 1_901_000


def test_op_names_and_comm_kernels() -> None:
    name = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    assert canonical_op(name) == "all_reduce"
    assert canonical_op("ncclKernel_AllGather_RING_LL_Sum_int8_t") == "all_gather"
    assert canonical_op("ncclKernel_ReduceScatter_RING_SIMPLE_Sum_bfloat16") == "reduce_scatter"
    assert canonical_op("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)") == "send_recv"
    assert canonical_op("_allgather_base") == "all_gather"
    assert canonical_op("c10d::alltoall_base_") == "all_to_all"
    assert canonical_op("reduce_scatter_tensor_coalesced") == "reduce_scatter"
    assert is_comm_kernel("ncclDevKernel_Generic_4(ncclDevComm*, unsigned long, ncclWork*)")
    assert is_comm_kernel("ncclKernel_AllReduce_RING_LL_Sum_float")  # RCCL keeps NCCL's kernel names
    assert is_comm_kernel("rcclGenericKernel")
    assert not is_comm_kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n")
    assert rank_from_name(Path("rank7.json")) == 7
    assert rank_from_name(Path("trace_rank-03.pt.trace.json.gz")) == 3
    assert rank_from_name(Path("host_123.1700000000000.pt.trace.json")) is None


def test_streaming_memory_grows_far_slower_than_file_size(tmp_path: Path) -> None:
    """Marginal Python-heap peak per trace byte is small: events are never all held, only kept fields."""
    peaks, sizes = [], []
    for steps in (8, 32):
        job = SyntheticJob(world_size=1, steps=steps, kernels_per_step=100)
        path = write_job(tmp_path / str(steps), job)[0]
        tracemalloc.start()
        try:
            trace = parse_trace(path)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(trace.kernels.ts) == job.steps * job.kernels_per_step
        peaks.append(peak)
        sizes.append(path.stat().st_size)
    marginal = (peaks[1] - peaks[0]) / (sizes[1] - sizes[0])
    assert marginal < 0.1, (peaks, sizes)


def test_trace_without_steps_is_a_parse_error(tmp_path: Path) -> None:
    p = tmp_path / "rank0.json"
    p.write_text(
        json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.0, "dur": 2.0}]})
    )
    with pytest.raises(ParseError, match="ProfilerStep"):
        parse_trace(p)


# ---- bad input through the real CLI: one line, exit 2, nothing written ----


def _assert_clean_failure(r, out: Path, needle: str) -> None:  # type: ignore[no-untyped-def]
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert needle in lines[0], lines[0]
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.importing")]


def test_cli_truncated_gzip(cli, kineto_gz: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "src"
    shutil.copytree(kineto_gz, src)
    victim = src / "rank3.pt.trace.json.gz"
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    out = tmp_path / "run"
    _assert_clean_failure(cli("import", "kineto", str(src), "-o", str(out)), out, "rank3.pt.trace.json.gz")


def test_cli_invalid_json(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    job = SyntheticJob(world_size=2, steps=3, kernels_per_step=3)
    src = tmp_path / "src"
    paths = write_job(src, job)
    text = paths[1].read_text()
    cut = text.index(",\n", len(text) // 2) + 1  # between two events
    paths[1].write_text(text[:cut] + "{oops" + text[cut:])
    out = tmp_path / "run"
    _assert_clean_failure(cli("import", "kineto", str(src), "-o", str(out)), out, "invalid JSON")


def test_cli_empty_and_mixed_folders(cli, kineto_gz: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "run"
    _assert_clean_failure(cli("import", "kineto", str(empty), "-o", str(out)), out, "empty folder")
    mixed = tmp_path / "mixed"
    shutil.copytree(kineto_gz, mixed)
    (mixed / "trace.parquet").write_bytes(b"PAR1")
    _assert_clean_failure(cli("import", "kineto", str(mixed), "-o", str(out)), out, "mixed folder")


def test_cli_no_rank_anywhere(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    job = SyntheticJob(world_size=1, steps=2, kernels_per_step=2)
    src = tmp_path / "src"
    p = write_job(src, job, distributed_info=False)[0]
    p.rename(src / "myhost_4242.1780000000000.pt.trace.json")
    out = tmp_path / "run"
    _assert_clean_failure(cli("import", "kineto", str(src), "-o", str(out)), out, "no distributedInfo.rank")


def test_cli_never_overwrites_and_succeeds_with_json(cli, kineto_gz: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "existing"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = cli("import", "kineto", str(kineto_gz), "-o", str(out))
    assert r.returncode == 2 and "not empty" in r.stderr
    assert (out / "keep.txt").read_text() == "mine" and len(list(out.iterdir())) == 1
    fresh = tmp_path / "fresh"
    r = cli("import", "kineto", str(kineto_gz), "-o", str(fresh), "--format", "json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["world_size"] == 4 and summary["collective_rows"] == 4 * 6 * 2


def test_gzip_single_file_and_duplicate_rank(tmp_path: Path, kineto_gz: Path) -> None:
    one = load_run(import_kineto(kineto_gz / "rank1.pt.trace.json.gz", tmp_path / "one"))
    assert one.ranks["rank"].to_list() == [1]
    dup = tmp_path / "dup"
    dup.mkdir()
    shutil.copy(kineto_gz / "rank1.pt.trace.json.gz", dup / "a.json.gz")
    shutil.copy(kineto_gz / "rank1.pt.trace.json.gz", dup / "b.json.gz")
    with pytest.raises(Exception, match="appears twice"):
        import_kineto(dup, tmp_path / "dupout")
    assert not (tmp_path / "dupout").exists()
    # gzip content is the same JSON as the plain file
    with gzip.open(kineto_gz / "rank0.pt.trace.json.gz", "rt") as fh:
        assert '"distributedInfo"' in fh.read(4096)


def test_real_gloo_profiler_traces(tmp_path: Path) -> None:
    """Traces written by torch 2.13's profiler (tensorboard_trace_handler) in a 2-rank gloo DDP run
    (rank 1 slept 20 ms per step; the machine was loaded): no GPU, collectives are gloo's worker spans."""
    src = Path(__file__).parent / "data" / "real_gloo"
    run = load_run(import_kineto(src, tmp_path / "run"))
    assert run.world_size == 2
    assert run.ranks["host"].to_list() == ["vm", "vm"]  # top-level host_name
    assert sorted(run.steps["step"].unique().to_list()) == [2, 3, 4, 5, 6, 7]
    c = run.collectives
    assert run.manifest.extra["collectives_from"] == "cpu ops"
    assert c.height == 12 and set(c["op"].to_list()) == {"all_reduce"}
    inst = c.group_by(["group", "seq"]).agg(
        pl.len().alias("n"), (pl.col("t_exit_ns").max() - pl.col("t_exit_ns").min()).alias("exit_spread")
    )
    assert (inst["n"] == 2).all()
    # both ranks leave each all-reduce nearly together (one host's clock; thread wake-ups on a loaded
    # machine spread it by up to ~12 ms once), while arrivals differed by up to ~350 ms
    assert float(inst["exit_spread"].median()) < 2_000_000


def test_distributed_info_after_trace_events(tmp_path: Path) -> None:
    """Keys after the traceEvents array (read from the streamed tail) count as much as keys before it."""
    job = SyntheticJob(world_size=2, steps=2, kernels_per_step=2)
    text = (write_job(tmp_path / "w", job)[1]).read_text()
    doc = json.loads(text)
    info, base = doc.pop("distributedInfo"), doc.pop("baseTimeNanoseconds")
    events = doc.pop("traceEvents")
    (tmp_path / "src").mkdir()
    moved = {"schemaVersion": 1, "traceEvents": events, "distributedInfo": info, "baseTimeNanoseconds": base}
    (tmp_path / "src" / "trace.json").write_text(json.dumps(moved))
    trace = parse_trace(tmp_path / "src" / "trace.json")
    assert trace.rank == 1 and trace.world_size == 2 and trace.base_ns == base
