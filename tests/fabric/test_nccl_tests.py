"""nccl-tests log parser: the real validation logs, format variants, and file:line errors."""

from __future__ import annotations

import pytest

from fabricpace._errors import ParseError
from fabricpace.fabric.nccl_tests import parse_log

HEADER = "\n".join(
    [
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 16 step: 2(factor) warmup iters: 5 iters: 20 "
        "agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
        "#  Rank  0 Group  0 Pid   6899 on hosta device  0 [0000:04:00] NVIDIA H100 80GB HBM3",
        "#  Rank  1 Group  0 Pid   6733 on hostb device  0 [0000:04:00] NVIDIA H100 80GB HBM3",
        "#",
        "#" + " " * 62 + "out-of-place" + " " * 23 + "in-place",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
        "            (us)  (GB/s)  (GB/s)",
        "",
    ]
)


def row(*fields: object) -> str:
    """A result row the way nccl-tests right-aligns it."""
    widths = (12, 14, 10, 8, 8, 9, 8, 8, 7, 9, 8, 8, 7)
    return "".join(str(f).rjust(w) for f, w in zip(fields, widths, strict=False)) + "\n"


def test_real_logs_parse_with_ranks_nodes_and_rows(data_dir):
    for nodes in (2, 4, 8):
        log = parse_log(data_dir / f"h100ib_n{nodes}_all_reduce.log")
        assert log.op == "all_reduce"
        assert (log.nranks, log.nodes, log.gpus_per_node) == (8 * nodes, nodes, 8)
        assert len(log.rows) == 14 and log.rows[0].size == 1 << 20 and log.rows[-1].size == 8 << 30
    n8 = parse_log(data_dir / "h100ib_n8_all_reduce.log")
    row = n8.rows[5]
    assert (row.size, row.count, row.type, row.redop, row.root) == (33554432, 8388608, "float", "sum", -1)
    assert (row.time_us, row.algbw, row.busbw, row.inplace_time_us) == (509.6, 65.84, 129.63, 508.2)
    assert n8.avg_busbw == pytest.approx(183.055)


def test_mpirun_prefixes_info_lines_and_op_from_the_command(tmp_path):
    body = HEADER + row(8, 2, "float", "sum", -1, 135.8, "0.00", "0.00", 0, 123.5, "0.00", "0.00", 0)
    text = "mpirun -np 2 ./build/all_gather_perf -b 8 -e 16\n" + "\n".join(
        f"[1,0]<stdout>:{line}" for line in body.splitlines()
    )
    text = text.replace(
        "#  Rank  1", "hosta:1:1 [0] NCCL INFO Bootstrap: Using eth0\n[1,0]<stdout>:#  Rank  1"
    )
    p = tmp_path / "run.txt"
    p.write_text(text)
    log = parse_log(p)
    assert log.op == "all_gather" and log.nodes == 2 and log.rows[0].time_us == 135.8


def test_legacy_format_without_root_column(tmp_path):
    text = HEADER.replace("   root", "").replace(
        "#        (B)    (elements)                               (us)", "#        (B)    (elements)     (us)"
    )
    text += "".join(
        f"{f:>9}" for f in (16, 4, "float", "sum", 319.4, "0.00", "0.00", "2e-07", 319.2, "0.00", "0.00")
    )
    text += "  0e+00\n"
    p = tmp_path / "reduce_scatter.log"
    p.write_text(text)
    log = parse_log(p)
    assert log.op == "reduce_scatter" and log.rows[0].root == -1 and log.rows[0].time_us == 319.4


def test_malformed_row_names_file_and_line(tmp_path):
    p = tmp_path / "bad_all_reduce.log"
    p.write_text(HEADER + "           8             2     float     sum      -1    13x.8    0.00\n")
    with pytest.raises(ParseError, match=r"bad_all_reduce\.log:10: expected 13 columns"):
        parse_log(p)
    p.write_text(HEADER + row(8, 2, "float", "sum", -1, "abc", "0.00", "0.00", 0, "1.0", "0.00", "0.00", 0))
    with pytest.raises(ParseError, match=r"bad_all_reduce\.log:10: cannot read a number"):
        parse_log(p)


def test_no_table_is_an_error(tmp_path):
    p = tmp_path / "empty.log"
    p.write_text("hello\n")
    with pytest.raises(ParseError, match="no nccl-tests result table"):
        parse_log(p)
    with pytest.raises(ParseError, match="cannot read"):
        parse_log(tmp_path / "missing.log")


def test_abridged_rank_list_infers_nodes_from_device_indices(tmp_path):
    lines = HEADER.splitlines()
    ranks = [
        "#  Rank  0 Group  0 Pid 563473 on   GPU-3882 device  0 [0008:06:00] NVIDIA GB300",
        "#  Rank  1 Group  0 Pid 563474 on   GPU-3882 device  1 [0009:06:00] NVIDIA GB300",
        "...",
        "#  Rank 62 Group  0 Pid 480831 on   GPU-6569 device  2 [0018:06:00] NVIDIA GB300",
        "#  Rank 63 Group  0 Pid 480833 on   GPU-6569 device  3 [0019:06:00] NVIDIA GB300",
    ]
    text = "\n".join(lines[:3] + ranks + lines[5:]) + "\n"
    text += row(8, 2, "float", "sum", -1, 12.0, "0.00", "0.00", 0, 12.0, "0.00", "0.00", 0)
    p = tmp_path / "all_reduce.log"
    p.write_text(text)
    log = parse_log(p)
    assert (log.nranks, log.nodes, log.gpus_per_node) == (64, 16, 4)
