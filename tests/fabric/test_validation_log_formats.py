"""nccl-tests log formats that real runs print and that ``--calibrate`` must read (data/README.md):

* a real 2-node log of nccl-tests #309 (qoofyk): Open MPI warning banners before the header and its
  help-message lines between '# Using devices' and the rank list, an 'NCCL version' line, 8 B..16 GiB;
* rows with a blank redop column: all_gather.cu and alltoall.cu of several nccl-tests versions (and forks)
  pass "" as the op name, which the row printer writes with ``%6s`` (src/util.cu
  ``writeBenchmarkLinePreamble``);
* the 2019 all_gather layout (all_gather.cu @ 0f8c785a, ``print_header``/``print_line_header``): no redop
  and no root column at all.
The last two are built from a real all-gather log by the transformation the nccl-tests source gives; the
parsed numbers must be exactly the original's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fabricpace._errors import ParseError
from fabricpace.fabric import load_cluster
from fabricpace.fabric.calibrate import calibrate_cluster, points_from_logs
from fabricpace.fabric.nccl_tests import NcclTestsLog, parse_log

GATHER = "h200gke_n2_skypilot_all_gather.log"
_ROW = re.compile(r"^(\s*\d+\s+\d+\s+float)(\s+none)(\s+-1)")


def numbers(log: NcclTestsLog) -> list[tuple]:
    """The measured values of every row (not the redop name)."""
    return [(r.size, r.count, r.type, r.time_us, r.algbw, r.busbw, r.inplace_time_us) for r in log.rows]


def bare(data_dir: Path) -> list[str]:
    """The real all-gather log without its SkyPilot / Open MPI prefixes (as a plain mpirun prints it)."""
    text = (data_dir / GATHER).read_text().splitlines()
    return [x.split("<stdout>:", 1)[1] for x in text if "<stdout>:" in x]


def test_real_309_bare_metal_log_with_mpi_banners_and_16g_rows(data_dir):
    log = parse_log(data_dir / "h100ib309q_n2_bm_all_reduce.log")
    assert (log.op, log.nodes, log.nranks, log.gpus_per_node) == ("all_reduce", 2, 16, 8)
    assert log.hosts == ("bm-h100-01", "bm-h100-02") and log.avg_busbw == 139.56
    sizes = log.sizes()
    assert len(sizes) == 32 and sizes[0] == 8 and sizes[-1] == 16 << 30
    assert log.rows[-1].time_us == 68652 and log.rows[-1].busbw == 469.21
    pts = points_from_logs([log])  # the calibration window, 32 MiB .. 8 GiB
    assert (int(pts.nbytes.min()), int(pts.nbytes.max()), len(pts)) == (32 << 20, 8 << 30, 9)


def test_blank_redop_rows_read_as_their_original(data_dir, tmp_path):
    lines = bare(data_dir)
    blank = [_ROW.sub(lambda m: m.group(1) + " " * len(m.group(2)) + m.group(3), x) for x in lines]
    assert sum(a != b for a, b in zip(lines, blank, strict=True)) == 24  # every row lost its 'none'
    original = parse_log(data_dir / GATHER)
    for name, text in (
        ("blank_all_gather.log", blank),
        # a prefix the parser does not know
        ("docker_all_gather.log", [f"nccl-worker-0  | {x}" for x in blank]),
    ):
        p = tmp_path / name
        p.write_text("\n".join(text) + "\n")
        log = parse_log(p)
        assert numbers(log) == numbers(original) and {r.redop for r in log.rows} == {"none"}
        assert (log.op, log.nodes, log.nranks) == ("all_gather", 2, 16)


def test_2019_all_gather_layout_without_redop_and_root(data_dir, tmp_path):
    # all_gather.cu @ 0f8c785a: header 'size count type time algbw busbw error ...', rows 'size count type
    # time ...'
    header = (
        "#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error"
    )
    out = []
    for x in bare(data_dir):
        if re.search(r"\bsize\s+count\s+type\s+redop\b", x):
            out.append(header)
        else:
            out.append(_ROW.sub(lambda m: m.group(1), x))
    p = tmp_path / "old_all_gather.log"
    p.write_text("\n".join(out) + "\n")
    log = parse_log(p)
    original = parse_log(data_dir / GATHER)
    assert numbers(log) == numbers(original) and {r.root for r in log.rows} == {-1}


def test_cli_calibrates_from_blank_redop_rows_like_the_original(cli, data_dir, tmp_path):
    blank = [_ROW.sub(lambda m: m.group(1) + " " * len(m.group(2)) + m.group(3), x) for x in bare(data_dir)]
    p = tmp_path / "n2_all_gather.log"
    p.write_text("\n".join(blank) + "\n")
    r = cli("collective", "--cluster", "p5-efa", "--op", "all_gather", "--nodes", "8", "--sizes", "1G",
            "--calibrate", str(p), "--format", "json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    fit = calibrate_cluster(load_cluster("p5-efa"), [data_dir / GATHER])
    printed = next(x for x in r.stderr.splitlines() if x.startswith("calibrated on"))
    assert printed == fit.summary()
    rows = json.loads(r.stdout)
    assert [(x["op"], x["nodes"], x["bytes"]) for x in rows] == [("all_gather", 8, 1 << 30)]


def test_rccl_tests_algo_proto_nchannels_columns_are_carried(data_dir, tmp_path):
    """rccl-tests -A 1 (2025 develop builds) appends 'algo proto nchannels' after the in-place #wrong, in the
    header and in every row, and prints 'rccl-tests: Version' and 'RCCL version :' lines. Built from the real
    2-node #309 log; the layout is that of a public MI350X sample (data/README.md)."""
    src = data_dir / "h100ib_n2_all_reduce.log"
    out = []
    for x in src.read_text().splitlines():
        if re.search(r"\bsize\s+count\s+type\s+redop\b", x):
            out.append(x.rstrip() + "     algo     proto   nchannels")
        elif re.match(r"\s*\d+\s+\d+\s+float\s", x):
            out.append(x.rstrip() + "    RING    SIMPLE          32")
        elif x.startswith("# Using devices"):
            out += ["rccl-tests: Version develop:6405c76", x]
        else:
            out.append(x)
    header = next(i for i, x in enumerate(out) if "size" in x and "count" in x)
    out.insert(header - 1, "RCCL version : 2.27.7")
    p = tmp_path / "rccl_n2_all_reduce.log"
    p.write_text("\n".join(out) + "\n")
    original = parse_log(src)
    log = parse_log(p)
    assert numbers(log) == numbers(original) and (log.nodes, log.nranks) == (2, 16)
    # a row without the announced columns is still refused, with its line
    at = next(i for i, x in enumerate(out) if x.endswith("SIMPLE          32"))
    out[at] = out[at][: -len("    RING    SIMPLE          32")]
    bad = tmp_path / "cut_n2_all_reduce.log"
    bad.write_text("\n".join(out) + "\n")
    with pytest.raises(ParseError, match=rf"cut_n2_all_reduce\.log:{at + 1}: expected 16 columns"):
        parse_log(bad)
