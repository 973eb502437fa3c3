"""nccl-tests logs as clusters print them: launcher prefixes, newer column layouts, cut-off and mixed files.

Real logs in ``data/`` (sources in ``data/README.md``) are read as they were posted. Variants without a
public raw log are built here from a real log by a transformation each helper documents (a prefix on every
line, other line ends or encoding, the columns newer nccl-tests versions add, a cut, two logs in one
file). A transformed log must parse to exactly what its original parses to, and through the real CLI it
must give the same calibration; bad input stays a one-line ``file:line`` error with exit code 2.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from fabricpace._errors import ParseError
from fabricpace.fabric.nccl_tests import NcclTestsLog, parse_log

DATA = Path(__file__).parent / "data"
N2 = DATA / "h100ib_n2_all_reduce.log"
N4 = DATA / "h100ib_n4_all_reduce.log"


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines()


def summary(log: NcclTestsLog) -> tuple:
    """Everything calibration and import read from a log (not its path)."""
    return (log.op, log.nranks, log.nodes, log.gpus_per_node, log.hosts, log.rows, log.avg_busbw)


def prefixed(make: Callable[[int], str]) -> Callable[[list[str]], bytes]:
    """Transformation: ``make(i)`` in front of line i, as a launcher or log system writes it."""
    return lambda lines: "".join(make(i) + line + "\n" for i, line in enumerate(lines)).encode()


def _ctime(i: int) -> str:  # C ctime() as Open MPI's --timestamp-output prints it (day padded to 2)
    return f"Mon Jun  2 10:00:{i % 60:02d} 2025"


def _rfc3339(i: int) -> str:  # kubectl logs --timestamps / CRI: RFC 3339 with nanoseconds
    return f"2025-06-18T10:{i // 60 % 60:02d}:{i % 60:02d}.{123456789 + i}Z"


PREFIXES: dict[str, Callable[[list[str]], bytes]] = {
    "srun -l, 1-9 tasks": prefixed(lambda i: "0: "),
    "srun -l, 10-99 tasks": prefixed(lambda i: " 0: "),
    "mpirun --tag-output": prefixed(lambda i: "[1,0]<stdout>:"),
    "mpirun --timestamp-output --tag-output": prefixed(lambda i: _ctime(i) + "[1,0]<stdout>:"),
    "mpirun --timestamp-output": prefixed(lambda i: _ctime(i) + "<stdout>:"),
    # Open MPI 5 formats its tags in PMIx (src/common/pmix_iof.c): "[jobid,rank]<stdout>: " and friends
    "Open MPI 5 --output tag": prefixed(lambda i: "[1,0]<stdout>: "),
    "Open MPI 5 --output tag-detailed": prefixed(lambda i: "[1,0][gpu-node-01:48213]<stdout>: "),
    "Open MPI 5 --output tag-fullname": prefixed(lambda i: "[prterun-gpu-node-01-48190@1,0]<stdout>: "),
    "Open MPI 5 --output rank": prefixed(lambda i: "[0]<stdout>: "),
    "Open MPI 5 --output tag,timestamp": prefixed(lambda i: f"[{_ctime(i)}][1,0]<stdout>: "),
    "Open MPI 5 --output timestamp": prefixed(lambda i: f"[{_ctime(i)}]<stdout>: "),
    "kubectl logs --timestamps": prefixed(lambda i: _rfc3339(i) + " "),
    "CRI log file on the node": prefixed(lambda i: _rfc3339(i) + " stdout F "),
    "SkyPilot over --tag-output": prefixed(lambda i: "(head, rank=0, pid=3808) [1,0]<stdout>:"),
    "kubectl --timestamps over srun -l": prefixed(lambda i: _rfc3339(i) + "  0: "),
    "unknown prefix (docker compose)": prefixed(lambda i: "nccl-worker-0  | "),
    "MPICH (Hydra) -prepend-rank": prefixed(lambda i: "[0] "),  # "[%r] " in hydra's mpiexec options
    "CRLF line ends": lambda lines: "".join(line + "\r\n" for line in lines).encode(),
    "UTF-8 with BOM": lambda lines: ("\n".join(lines) + "\n").encode("utf-8-sig"),
    "UTF-16 (PowerShell >)": lambda lines: ("\r\n".join(lines) + "\r\n").encode("utf-16"),
}


def _is_header(line: str) -> bool:
    return bool(re.search(r"\bsize\s+count\s+type\s+redop\b", line))


def _is_row(line: str) -> bool:
    return bool(re.match(r"\s*\d+\s+\d+\s+float\s", line))


def per_iteration_columns(lines: list[str]) -> list[str]:
    """nccl-tests 2.18+ per-iteration timing (src/util.cu): ``i_min i_max i_p99 i_cv%`` after each
    ``#wrong`` (header and rows). The per-iteration values are not read by the parser; the transformation
    writes the row's average time for the three times and 0.00 for i_cv%."""
    out = []
    for line in lines:
        if _is_header(line):
            line = line.replace("#wrong", "#wrong    i_min    i_max    i_p99    i_cv%")
        elif _is_row(line):
            f = line.split()
            f = f[:9] + [f[5]] * 3 + ["0.00"] + f[9:] + [f[9]] * 3 + ["0.00"]
            line = f"{f[0]:>12}" + "".join(f" {x:>8}" for x in f[1:])  # right-aligned like nccl-tests
        out.append(line)
    return out


def timestamp_column(lines: list[str]) -> list[str]:
    """``-S 1`` (report_timestamps, src/util.cu): a ``timestamp`` column, printed ``%Y-%m-%d %H:%M:%S``
    after the in-place block of each row."""
    out = []
    for line in lines:
        if _is_header(line):
            line += "            timestamp"
        elif "(elements)" in line:
            line += "  %Y-%m-%d %H:%M:%S"
        elif _is_row(line):
            line += "  2025-06-18 10:00:00"
        out.append(line)
    return out


def newer_header_lines(lines: list[str]) -> list[str]:
    """The lines nccl-tests 2.17/2.18 add around a run (src/util.cu), plus ``-z 1``'s blocking line and
    ``-C 1``'s ``cputime`` column label."""
    out = [
        "# nccl-tests version 2.18.3 nccl-headers=22907 nccl-library=22907",
        "# Collective test starting: all_reduce_perf",
    ]
    for line in lines:
        if "# nThread" in line:
            out += [line + " unalign: 0"]
            out += ["# Blocking Enabled: wait for completion and barrier after each collective "]
            continue
        if _is_header(line):
            line = re.sub(r"    time(?=\s|$)", " cputime", line)
        out.append(line)
    return [*out, "# Collective test concluded: all_reduce_perf", "#"]


def write(tmp_path: Path, name: str, content: bytes | str) -> Path:
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


# ---- real logs as posted ----------------------------------------------------------------------------
def test_real_srun_label_log_with_na_wrong_counts(data_dir):
    log = parse_log(data_dir / "h100ib290_n2_srun_all_reduce.log")
    assert (log.op, log.nranks, log.nodes, log.gpus_per_node) == ("all_reduce", 16, 2, 8)
    assert log.hosts == ("node005", "node007") and len(log.rows) == 11 and log.avg_busbw == 142.735
    assert (log.rows[0].size, log.rows[0].time_us, log.rows[-1].inplace_time_us) == (8 << 20, 215.3, 103538)


def test_real_single_process_g8_and_threads_count_hosts_not_processes(data_dir):
    g8 = parse_log(data_dir / "h100ib290_n1_g8_all_reduce.log")  # -g 8: 8 rank lines, one Pid
    assert (g8.nranks, g8.nodes, g8.gpus_per_node, g8.hosts) == (8, 1, 8, ("node005",))
    t2 = parse_log(data_dir / "a100_n1_t2_sendrecv.log")  # -t 2, NCCL INFO lines inside the table
    assert (t2.op, t2.nranks, t2.nodes, t2.gpus_per_node, len(t2.rows)) == ("sendrecv", 2, 1, 2, 29)
    assert t2.rows[-1].time_us == 29935 and t2.avg_busbw == 24.3607


def test_g8_and_threads_across_nodes(tmp_path):
    """-g 8 (or -t 2 -g 4) on 4 nodes: one process per node prints 8 rank lines with one Pid; the node count
    is still the number of hosts. Built from the 4-node log by giving each host's ranks its first Pid."""
    out, pid = [], {}
    for line in lines_of(N4):
        m = re.match(r"(#\s+Rank\s+\d+\s+Group\s+\d+\s+Pid\s+)(\d+)(\s+on\s+)(\S+)(.*)", line)
        if m:
            line = m.group(1) + pid.setdefault(m.group(4), m.group(2)) + "".join(m.group(3, 4, 5))
        out.append(line.replace("nGpus 1", "nGpus 8").replace("-np 32", "-np 4"))
    log = parse_log(write(tmp_path, "g8.log", "\n".join(out)))
    assert (log.nranks, log.nodes, log.gpus_per_node) == (32, 4, 8) and log.rows == parse_log(N4).rows


def test_real_newer_version_lines_and_nonzero_wrong_counts(data_dir):
    log = parse_log(data_dir / "gh200_n2_v2178_all_reduce.log")
    assert (log.op, log.nranks, log.nodes, log.gpus_per_node, len(log.rows)) == ("all_reduce", 2, 2, 1, 25)
    assert log.rows[0].algbw == 0.0 and log.rows[17].time_us == 477.32  # tiny sizes: algbw 0.00 is kept


def test_real_skypilot_prefix_and_op_from_file_name(data_dir):
    log = parse_log(data_dir / "h200gke_n2_skypilot_all_gather.log")
    assert (log.op, log.nranks, log.nodes, log.gpus_per_node, len(log.rows)) == ("all_gather", 16, 2, 8, 24)
    assert log.rows[20].size == 1 << 30 and log.rows[20].time_us == 3123.9


def test_real_run_that_failed_before_measuring(data_dir):
    with pytest.raises(
        ParseError, match=r"gh200_n2_failed_all_reduce\.log:13: the run stopped after its header"
    ):
        parse_log(data_dir / "gh200_n2_failed_all_reduce.log")


# ---- transformed variants parse exactly like their original ---------------------------------------------
@pytest.mark.parametrize("name", sorted(PREFIXES))
def test_prefixes_and_encodings(tmp_path, name):
    log = parse_log(write(tmp_path, "v.log", PREFIXES[name](lines_of(N4))))
    assert summary(log) == summary(parse_log(N4))


def test_nccl_info_lines_from_hosts_whose_names_start_with_a_digit(tmp_path):
    """NCCL_DEBUG=INFO on the 4-node cluster, whose host names are hex (0666a154, ...): its INFO lines start
    with a digit. Inserted, in NCCL's 'host:pid:tid [dev] NCCL INFO' form, after every nccl-tests line."""
    info = "0666a154:88455:88455 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"
    text = "".join(f"{x}\n{info}\n" for x in lines_of(N4))
    assert summary(parse_log(write(tmp_path, "info.log", text))) == summary(parse_log(N4))


@pytest.mark.parametrize("transform", [per_iteration_columns, timestamp_column, newer_header_lines])
def test_newer_column_layouts(tmp_path, transform):
    log = parse_log(write(tmp_path, "v.log", "\n".join(transform(lines_of(N4)))))
    assert summary(log) == summary(parse_log(N4))


def test_real_srun_log_equals_its_unprefixed_copy(tmp_path, data_dir):
    real = data_dir / "h100ib290_n2_srun_all_reduce.log"
    bare = write(tmp_path, "h100ib290_n2_all_reduce.log", "\n".join(x[4:] for x in lines_of(real)))
    assert summary(parse_log(bare)) == summary(parse_log(real))


# ---- cut-off logs, rows without a time ---------------------------------------------------------------
def test_log_cut_mid_row_keeps_the_complete_rows(tmp_path):
    lines = lines_of(N4)
    last = max(i for i, x in enumerate(lines) if _is_row(x))
    cut = "\n".join(lines[:last]) + "\n" + lines[last][:58]  # killed while printing the 8 GiB row
    whole = parse_log(N4)
    for tail in ("", "\nsrun: error: node3: task 7: Killed\n"):
        log = parse_log(write(tmp_path, "cut.log", cut + tail))
        assert log.rows == whole.rows[:-1] and log.truncated_at == last + 1 and log.avg_busbw is None


def test_bad_row_inside_the_table_is_still_an_error(tmp_path):
    lines = lines_of(N4)
    i = next(i for i, x in enumerate(lines) if _is_row(x) and x.split()[0] == "4194304")
    lines[i] = lines[i][:60]
    with pytest.raises(ParseError, match=rf"bad\.log:{i + 1}: expected 13 columns"):
        parse_log(write(tmp_path, "bad.log", "\n".join(lines)))


def test_rows_without_a_measured_time_are_dropped(tmp_path):
    lines, gone = lines_of(N4), {}
    for size, text in ((16 << 20, "inf"), (64 << 20, "nan"), (128 << 20, "-nan"), (256 << 20, "0.00")):
        i = next(i for i, x in enumerate(lines) if _is_row(x) and int(x.split()[0]) == size)
        f = lines[i].split()
        f[5] = text
        lines[i], gone[size] = "  ".join(f), True
    log = parse_log(write(tmp_path, "inf.log", "\n".join(lines)))
    assert log.dropped_rows == 4 and log.rows == tuple(r for r in parse_log(N4).rows if r.size not in gone)
    nan_only = [("  ".join([*x.split()[:5], "nan", *x.split()[6:]]) if _is_row(x) else x) for x in lines]
    with pytest.raises(ParseError, match="no result row has a measured time"):
        parse_log(write(tmp_path, "nan.log", "\n".join(nan_only)))


# ---- files that hold more than one run -------------------------------------------------------------------
def test_two_runs_back_to_back_name_the_line_to_split_at(tmp_path, data_dir):
    n2 = lines_of(N2)
    p = write(tmp_path, "both.log", "\n".join(n2 + lines_of(N4)))
    at = len(n2) + 2  # the 4-node run's '# nThread' line (its first line is the mpirun command)
    with pytest.raises(
        ParseError, match=rf"both\.log:{at}: a second nccl-tests run starts here.*split the log"
    ):
        parse_log(p)
    v = lines_of(data_dir / "gh200_n2_v2178_all_reduce.log")
    p = write(tmp_path, "twice.log", "\n".join(v + v))
    with pytest.raises(ParseError, match=rf"twice\.log:{len(v) + 1}: a second nccl-tests run starts here"):
        parse_log(p)


def test_nccl_tests_without_mpi_every_process_prints_its_own_run(tmp_path, data_dir):
    """Two processes of an nccl-tests built without MPI=1 (issues #107, #213): both print the header, then
    both rank lists (each starting at rank 0), then both tables. Built from the real -g 8 log."""
    g8 = lines_of(data_dir / "h100ib290_n1_g8_all_reduce.log")
    other = [x.replace("node005", "node007") for x in g8]
    both = g8[:3] + other[:3] + g8[3:11] + other[3:11] + g8[11:] + other[11:]
    with pytest.raises(ParseError, match=r"nompi\.log:4: a second nccl-tests header.*make MPI=1"):
        parse_log(write(tmp_path, "nompi.log", "\n".join(both)))
    one_header = g8[:11] + other[3:11] + g8[11:]
    with pytest.raises(ParseError, match=r"ranks\.log:12: rank 0 is listed twice \(node005, node007\)"):
        parse_log(write(tmp_path, "ranks.log", "\n".join(one_header)))


def test_split_communicators_are_refused(tmp_path):
    lines = [re.sub(r"(Rank\s+(1[6-9]|2\d|3[01])\s+Group)\s+0", r"\1  1", x) for x in lines_of(N4)]
    at = next(i for i, x in enumerate(lines) if "Group  1" in x) + 1
    with pytest.raises(ParseError, match=rf"split\.log:{at}: ranks are split into 2 groups"):
        parse_log(write(tmp_path, "split.log", "\n".join(lines)))


# ---- the same through the real CLI ----------------------------------------------------------------------
def calibrate(cli, *logs: Path) -> tuple[list[dict], str]:
    args = [a for log in logs for a in ("--calibrate", str(log))]
    r = cli(
        "collective", "--cluster", "dgx-h100-ib", "--op", "all_reduce", "--nodes", "8", "--sizes", "1G",
        *args, "--format", "json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    fit = [x for x in r.stderr.splitlines() if x.startswith("calibrated on")]
    return json.loads(r.stdout), fit[0]


def test_cli_calibration_is_the_same_from_transformed_logs(cli, tmp_path):
    """n2: kubectl timestamps over srun labels, CRLF, -S timestamps, 2.18 header lines, NCCL INFO lines of a
    host whose name starts with a digit. n4: SkyPilot over
    Open MPI --timestamp-output --tag-output, UTF-16, per-iteration columns, an 'inf' row and a cut last
    row. Reference: the original logs with those two rows deleted by hand."""
    info = "0666a154:88455:88455 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"
    n2 = [y for x in newer_header_lines(timestamp_column(lines_of(N2))) for y in (x, info)]
    n2_bytes = prefixed(lambda i: _rfc3339(i) + " 0: ")(n2).replace(b"\n", b"\r\n")
    n4 = per_iteration_columns(lines_of(N4))
    i64 = next(i for i, x in enumerate(n4) if _is_row(x) and x.split()[0] == str(64 << 20))
    n4[i64] = re.sub(r"^(\s*(?:\S+\s+){5})\S+", r"\g<1>inf", n4[i64])
    last = max(i for i, x in enumerate(n4) if _is_row(x))
    n4_text = "".join(f"(head, rank=0, pid=3808) {_ctime(i)}[1,0]<stdout>:{x}\n" for i, x in enumerate(n4))
    n4_text = n4_text[: n4_text.index(n4[last]) + 70]  # killed mid-row
    ref4 = [x for x in lines_of(N4) if not (_is_row(x) and x.split()[0] in (str(64 << 20), str(8 << 30)))]
    reference = calibrate(cli, N2, write(tmp_path, "ref_n4_all_reduce.log", "\n".join(ref4)))
    moved = calibrate(
        cli,
        write(tmp_path, "k8s_n2_all_reduce.log", n2_bytes),
        write(tmp_path, "sky_n4_all_reduce.log", n4_text.encode("utf-16")),
    )
    assert moved == reference


def test_cli_real_srun_log_calibrates_like_its_bare_copy(cli, tmp_path, data_dir):
    real = data_dir / "h100ib290_n2_srun_all_reduce.log"
    bare = [x[4:] for x in lines_of(real)]  # the ' 0: ' label removed ...
    other = write(tmp_path, "docker_n2_all_reduce.log", "".join(f"nccl-worker-0  | {x}\n" for x in bare))
    assert calibrate(cli, real) == calibrate(cli, other)  # ... and an unknown prefix put in its place


def test_cli_refuses_mixed_and_unfinished_logs_in_one_line(cli, tmp_path, data_dir):
    # two complete runs in one file are read since session 11 (tests/fabric/test_multi_run.py)
    g8 = lines_of(data_dir / "h100ib290_n1_g8_all_reduce.log")
    nompi = write(tmp_path, "nompi_all_reduce.log", "\n".join(g8[:3] + g8 + g8[3:]))
    twice = write(tmp_path, "twice_all_reduce.log", "\n".join(g8[:11] + g8[3:]))
    split = [re.sub(r"(Rank\s+(1[6-9]|2\d|3[01])\s+Group)\s+0", r"\1  1", x) for x in lines_of(N4)]
    for log, needle in (
        (nompi, "nompi_all_reduce.log:4: a second nccl-tests header"),
        (twice, "twice_all_reduce.log:12: rank 0 is listed twice"),
        (
            write(tmp_path, "split_all_reduce.log", "\n".join(split)),
            "split_all_reduce.log:21: ranks are split",
        ),
        (data_dir / "gh200_n2_failed_all_reduce.log", "gh200_n2_failed_all_reduce.log:13: the run stopped"),
    ):
        r = cli("collective", "--cluster", "dgx-h100-ib", "--calibrate", str(log))
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], r.stderr
        assert "Traceback" not in r.stderr
