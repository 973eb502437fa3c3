"""nccl-tests output as other clusters hand it over (issue 2: calibration on logs we have never seen).

Each variant is built from the real 2- and 4-node H100 logs (``data/h100ib_n{2,4}_all_reduce.log``, sources in
``data/README.md``) by the transformation its helper documents, following where the variant was seen:

* ANSI escape codes: colourising log viewers, ``script`` captures, ``docker compose logs`` (coloured service
  prefix ``ESC[36mworker-0  |ESC[0m``);
* ``-d all`` / ``-o all``: one size sweep per data type / reduction op, back to back in one table, float
  among them (``TimeTest`` per type and op in nccl-tests' ``src/*.cu``; the type order is
  ``test_typenames`` of ``src/common.cu``; seen in a stored public 2 x 8 H200 ``--datatype all`` log,
  nccl-tests 2.18.3 / NCCL 2.30.4, whose int8 rows take 24% longer than float on the same bytes);
* in-place-only rows: a fork's ``-O 0`` / trace replay prints the out-of-place block as 32 blanks
  (``writeBenchMarkLineNullBody`` in ``src/util.cu``);
* a run that failed or timed out mid-table: ``HOST: Test NCCL failure common.cu:N '...'`` and
  ``HOST: Test timeout (30s) common.cu:N`` (``src/common.h`` / ``testStreamSynchronize``);
* ranks spread unevenly over the hosts;
* the ``-J FILE.json`` output of nccl-tests 2.17+ (``src/util.cu``, ``JSON_FILE_VERSION 2``), written from
  the log's own header, rank lines and rows in the order and with the keys that code writes.
A variant must parse to exactly the clean log's numbers (or the documented subset), and through the real
CLI give the same calibration, with a note naming what was left out; bad input is one line and exit 2.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fabricpace._errors import ParseError
from fabricpace.fabric.nccl_tests import NcclTestsLog, parse_log

DATA = Path(__file__).parent / "data"
N2 = DATA / "h100ib_n2_all_reduce.log"
N4 = DATA / "h100ib_n4_all_reduce.log"
ESC = "\x1b"
# test_typenames of src/common.cu (NCCL >= 2.10 with bf16; f8 types from 2.24 builds on)
TYPES = (
    "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16", "f8e4m3"
)  # fmt: skip
OPS = ("sum", "prod", "max", "min", "avg", "mulsum")  # test_opnames


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines()


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def summary(log: NcclTestsLog) -> tuple:
    return (log.op, log.nranks, log.nodes, log.gpus_per_node, log.hosts, log.rows, log.avg_busbw)


def is_row(line: str) -> bool:
    return bool(re.match(r"\s*\d+\s+\d+\s+float\s", line))


# ---- transformations --------------------------------------------------------------------------------------
def ansi(lines: list[str], how: str) -> str:
    """Escape codes as three tools leave them: the whole line coloured, a coloured launcher prefix
    (docker compose), bold comment lines with a cursor code (``ESC[K``, erase to end of line)."""
    if how == "line":
        return "".join(f"{ESC}[32m{x}{ESC}[0m\n" for x in lines)
    if how == "prefix":
        return "".join(f"{ESC}[36mnccl-worker-0  |{ESC}[0m {x}\n" for x in lines)
    return "".join((f"{ESC}[1m{x}{ESC}[0m{ESC}[K" if x.startswith("#") else x) + "\n" for x in lines)


def sweeps(lines: list[str], *, column: int, names: tuple[str, ...], keep: str) -> str:
    """One sweep per name in ``column`` (2: type, 3: redop): the real rows' numbers as the ``keep`` sweep,
    the others with 25% longer times, numbers that must be left out, so any of them read would show."""
    rows = [x for x in lines if is_row(x)]
    first, last = lines.index(rows[0]), lines.index(rows[-1])
    table = []
    for name in names:
        for x in rows:
            f = x.split()
            if name != keep:
                f[5], f[9] = f"{float(f[5]) * 1.25:.1f}", f"{float(f[9]) * 1.25:.1f}"
            f[column] = name
            table.append(f"{f[0]:>12}  {f[1]:>12}  " + "  ".join(f"{v:>7}" for v in f[2:]))
    return "\n".join(lines[:first] + table + lines[last + 1 :]) + "\n"


def inplace_only(lines: list[str]) -> str:
    """writeBenchMarkLineNullBody: 32 blanks where the out-of-place time algbw busbw #wrong would be."""
    out = []
    for x in lines:
        if is_row(x):
            f = x.split()
            x = f"{f[0]:>12}  {f[1]:>12}  {f[2]:>8}  {f[3]:>6}  {f[4]:>6}{' ' * 32}  " + "  ".join(f[9:])
        out.append(x)
    return "\n".join(out) + "\n"


def failed_after(lines: list[str], kept: int, line: str) -> str:
    """The log up to its ``kept``-th row, then nccl-tests' failure line (the process exits there)."""
    rows = [i for i, x in enumerate(lines) if is_row(x)]
    return "\n".join([*lines[: rows[kept]], line]) + "\n"


def as_json(lines: list[str], *, out_of_place: bool = True) -> str:
    """The -J file of the same run, keyed as src/util.cu writes it: args (the command), config with devices
    (one per Rank line), results (one per row; 'root' is the %6i text), the footer objects."""
    cmd = next((x.split("./build/", 1)[1].split() for x in lines if "./build/" in x), ["all_reduce_perf"])
    devices = []
    for x in lines:
        m = re.search(r"Rank\s+(\d+) Group\s+(\d+) Pid\s+(\d+) on\s+(\S+) device\s+(\d+) \[(\S+)\] (.*)", x)
        if m:
            devices.append({"rank": int(m[1]), "group": int(m[2]), "pid": int(m[3]), "hostname": m[4],
                            "device": int(m[5]), "device_hex": m[6], "device_info": m[7]})  # fmt: skip
    results = []
    for x in lines:
        if is_row(x):
            f = x.split()
            block = [{"time": float(f[k]), "alg_bw": float(f[k + 1]), "bus_bw": float(f[k + 2]),
                      "nwrong": float(f[k + 3])} for k in (5, 9)]  # fmt: skip
            results.append({"size": int(f[0]), "count": int(f[1]), "type": f[2], "redop": f[3],
                            "root": f"{int(f[4]):6d}", "out_of_place": block[0] if out_of_place else None,
                            "in_place": block[1], "actual_iterations": 20,
                            "experiment_name": ""})  # fmt: skip
    avg = float(next(x for x in lines if "Avg bus bandwidth" in x).split(":")[1])
    doc = {
        "version": 2, "start_time": "2025-06-18 10:00:00", "args": [f"./build/{cmd[0]}", *cmd[1:]],
        "env": ["NCCL_DEBUG=WARN"], "nccl_version": 22703,
        "config": {"nthreads": 1, "ngpus": 1, "minimum_bytes": 1048576, "maximum_bytes": 8589934592,
                   "step_factor": 2, "warmup_iters": 5, "iterations": 20, "aggregated_iterations": 1,
                   "validation": 1, "graph": 0, "blocking_collectives": "false", "per_iter_timing": "false",
                   "parallel_init": "false", "devices": devices},
        "results": results, "out_of_bounds": {"count": 0, "okay": "true"},
        "average_bus_bandwidth": {"bandwidth": avg, "okay": "unchecked"}, "errors": [],
        "end_time": "2025-06-18 10:05:00",
    }  # fmt: skip
    return json.dumps(doc, separators=(",", ":"))


def rendered_table(lines: list[str]) -> str:
    """A log copied from a rendered GitHub page, as in microsoft/mscclpp PR #736 (an rccl-tests run pasted
    into the description): comment lines start with an escaped '\\#', each row became a markdown table row
    'a | b | c', with a '-- | -- |' separator line after the first one."""
    out, first = [], True
    for x in lines:
        if x.startswith("#"):
            out.append("\\" + x)
        elif is_row(x):
            out.append(" | ".join(x.split()))
            if first:
                out.append(" | ".join(["--"] * len(x.split())))
                first = False
        else:
            out.append(x)
    return "\n".join(out) + "\n"


# ---- parser level ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["line", "prefix", "comments"])
def test_ansi_escape_codes_are_not_part_of_the_log(tmp_path, how):
    """Before: 'cannot read the average bus bandwidth in '\\x1b[32m# Avg bus bandwidth ...' (exit 2)."""
    log = parse_log(write(tmp_path, "c.log", ansi(lines_of(N4), how)))
    assert summary(log) == summary(parse_log(N4))


@pytest.mark.parametrize(
    ("column", "names", "keep", "left_out"),
    [
        (2, TYPES, "float", 10),  # -d all: float kept (nccl-tests' default), the 10 other types left out
        (3, OPS, "sum", 5),  # -o all
        (2, ("bfloat16", "half"), "bfloat16", 1),  # no float sweep: the first one is used
    ],
)
def test_several_type_or_op_sweeps_use_one(tmp_path, column, names, keep, left_out):
    """Before: every sweep's rows were read, so the fit mixed int8 prod with float sum."""
    log = parse_log(write(tmp_path, "all.log", sweeps(lines_of(N4), column=column, names=names, keep=keep)))
    clean = parse_log(N4)
    if keep in ("float", "sum"):
        assert log.rows == clean.rows
    numbers = [(r.size, r.time_us, r.algbw, r.busbw, r.inplace_time_us) for r in log.rows]
    assert numbers == [(r.size, r.time_us, r.algbw, r.busbw, r.inplace_time_us) for r in clean.rows]
    assert {r.type if column == 2 else r.redop for r in log.rows} == {keep}
    assert len(log.other_sweeps) == left_out and "sweeps (-d all / -o all); using the" in log.notes()[0]


def test_rows_with_in_place_numbers_only(tmp_path):
    """Before: 'expected 13 columns ..., found 9'. The in-place numbers stand for the row."""
    log = parse_log(write(tmp_path, "ip.log", inplace_only(lines_of(N4))))
    clean = parse_log(N4)
    assert [(r.size, r.time_us, r.busbw) for r in log.rows] == [
        (r.size, r.inplace_time_us, r.inplace_busbw) for r in clean.rows
    ]
    assert log.inplace_only_rows == len(clean.rows) and "in-place times are used" in log.notes()[0]


def test_run_that_failed_mid_table_keeps_its_rows_and_says_where(tmp_path):
    """Before: the 9 rows before the failure were used silently, as if the run had ended at 256 MiB."""
    fail = "0666a154: Test NCCL failure common.cu:1005 'unhandled system error (run with NCCL_DEBUG=INFO)'"
    text = failed_after(lines_of(N4), 9, fail)
    log = parse_log(write(tmp_path, "f.log", text))
    at = text.splitlines().index(fail) + 1
    assert log.rows == parse_log(N4).rows[:9] and log.failed_at is not None and log.failed_at[0] == at
    assert log.notes()[0].startswith(f"note: f.log:{at}: the run failed here (")
    assert "Test NCCL failure common.cu:1005" in log.notes()[0] and "9 rows up to 256M" in log.notes()[0]
    timeout = failed_after(lines_of(N4), 3, "0666a154: Test timeout (30s) common.cu:344")
    assert "Test timeout (30s)" in parse_log(write(tmp_path, "t.log", timeout)).notes()[0]
    skipped = failed_after(lines_of(N4), 0, "# TEST SKIPPED: Device API is not supported on this system")
    with pytest.raises(ParseError, match=r"s\.log:\d+: the run stopped .*\(line \d+: 'TEST SKIPPED: Device"):
        parse_log(write(tmp_path, "s.log", skipped))
    before_rows = failed_after(lines_of(N4), 0, fail)
    with pytest.raises(ParseError, match=r"b\.log:\d+: the run stopped after its header.*\(line \d+: .Test"):
        parse_log(write(tmp_path, "b.log", before_rows))


def test_ranks_spread_unevenly_over_hosts_are_refused(tmp_path):
    """4 ranks on one host, 12 on the other (a hostfile with wrong slots). Before: read as 2 x 8."""
    out = []
    for x in lines_of(N2):
        m = re.search(r"Rank\s+(\d+)", x)
        if m and 4 <= int(m[1]) < 8:
            x = x.replace("0666a154", "b749a9b0")
        out.append(x)
    with pytest.raises(
        ParseError, match=r"u\.log:\d+: ranks are spread unevenly over the hosts \(0666a154: 4, b749a9b0: 12"
    ):
        parse_log(write(tmp_path, "u.log", "\n".join(out)))


def test_json_output_file_reads_like_the_log(tmp_path):
    """nccl-tests -J: the same run as a JSON file. Before: 'no nccl-tests result table found'."""
    log = parse_log(write(tmp_path, "run4.json", as_json(lines_of(N4))))
    assert summary(log) == summary(parse_log(N4))
    # a fork's in-place-only rows: out_of_place is null
    ip = parse_log(write(tmp_path, "ip.json", as_json(lines_of(N4), out_of_place=False)))
    assert [r.time_us for r in ip.rows] == [r.inplace_time_us for r in parse_log(N4).rows]
    # %lf prints an infinite time as the bare word inf: that row has no measured time
    text = as_json(lines_of(N4))
    inf = text.replace('"time":3600.8', '"time":inf', 1)
    assert inf != text and parse_log(write(tmp_path, "inf.json", inf)).dropped_rows == 1
    with pytest.raises(ParseError, match=r"cut\.json:1:\d+: not valid JSON .* give the run's stdout log"):
        parse_log(write(tmp_path, "cut.json", text[: len(text) // 2]))


def test_table_copied_from_a_rendered_page(tmp_path):
    """Before: 'the run stopped after its header: no result rows follow this line'."""
    log = parse_log(write(tmp_path, "md.log", rendered_table(lines_of(N4))))
    assert summary(log) == summary(parse_log(N4))


def test_empty_file_says_so(tmp_path):
    with pytest.raises(ParseError, match=r"e\.log: the file is empty"):
        parse_log(write(tmp_path, "e.log", "\n \n"))


# ---- through the real CLI ---------------------------------------------------------------------------------
def calibrate(cli, *logs: Path, op: str = "all_reduce") -> tuple[list[dict], str, list[str]]:
    args = [a for log in logs for a in ("--calibrate", str(log))]
    r = cli(
        "collective", "--cluster", "dgx-h100-ib", "--op", op, "--nodes", "8", "--sizes", "1G", *args,
        "--format", "json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    err = r.stderr.splitlines()
    fit = next(x for x in err if x.startswith("calibrated on"))
    return json.loads(r.stdout), fit, [x for x in err if x.startswith("note:")]


def test_cli_variants_calibrate_like_the_clean_logs(cli, tmp_path):
    """n2 as -J JSON, n4 coloured with -d all: the same fit and prediction as the clean logs, and a note for
    the left-out sweeps."""
    ref = calibrate(cli, N2, N4)
    n2 = write(tmp_path, "n2.json", as_json(lines_of(N2)))
    all_types = sweeps(lines_of(N4), column=2, names=TYPES, keep="float").splitlines()
    n4 = write(tmp_path, "n4_all_reduce.log", ansi(all_types, "prefix"))
    out, fit, notes = calibrate(cli, n2, n4)
    assert (out, fit) == ref[:2]
    assert any("n4_all_reduce.log: the table holds 11 type/op sweeps" in x for x in notes), notes


def test_cli_notes_for_failed_runs_mixed_ops_and_repeated_logs(cli, tmp_path, data_dir):
    fail = "0666a154: Test NCCL failure common.cu:1005 'unhandled system error'"
    cut = write(tmp_path, "n4_all_reduce.log", failed_after(lines_of(N4), 13, fail))
    gather = data_dir / "h200gke_n2_skypilot_all_gather.log"
    _, fit, notes = calibrate(cli, N2, cut, gather, N2)
    assert "from 2 logs" in fit, fit  # the all_gather log and the repeated n2 are left out
    assert any("n4_all_reduce.log:" in x and "the run failed here" in x and "up to 4G" in x for x in notes)
    assert any("left out h200gke_n2_skypilot_all_gather.log (all_gather)" in x for x in notes), notes
    twice = "h100ib_n2_all_reduce.log: the same measurements as h100ib_n2_all_reduce.log; counted once"
    assert any(twice in x for x in notes), notes
    one = calibrate(cli, data_dir / "h100ib290_n1_g8_all_reduce.log")[1]
    assert "every row is from 1 node, so no row crosses the network" in one
    small = [x for x in lines_of(N4) if not (is_row(x) and int(x.split()[0]) >= 32 << 20)]
    r = cli("collective", "--calibrate", str(write(tmp_path, "s.log", "\n".join(small))))
    assert r.returncode == 2 and "s.log: no rows between 33554432 and 8589934592 bytes (their rows span " \
        "1048576..16777216 B)" in r.stderr and "-b 32M -e 8G" in r.stderr  # fmt: skip
    r = cli("collective", "--cluster", "dgx-h100-ib", "--calibrate", str(write(tmp_path, "empty.log", "")))
    assert r.returncode == 2 and r.stderr.strip().endswith("empty.log: the file is empty; give the stdout of "
                                                           "all_reduce_perf / all_gather_perf")  # fmt: skip


# ---- a real log: nccl-tests #322 (data/README.md) ---------------------------------------------------------
R322 = DATA / "h100roce322_n128_failed_all_reduce.log"


def test_real_322_log_cut_rank_list_and_failure_after_five_rows(cli):
    """128 nodes x 8 H100 (RoCE), NCCL_ALGO=Ring NCCL_PROTO=LL128, 1-32 GiB. The post lists ranks 0..99 of
    1,024 (the list stops inside HCA-12), and the run fails after its 16 GiB row on HCA-128. Before: read
    as 12 nodes, then 'no Rank lines, so the node count is unknown' from calibration; the failure was not
    seen."""
    with pytest.raises(ParseError, match=r"n128_failed_all_reduce\.log:26: the rank list stops at rank 99,"):
        parse_log(R322)
    log = parse_log(R322, nodes=128)  # -np 1024 at 8 per node, from its command line
    assert [r.size for r in log.rows] == [1 << k for k in range(30, 35)] and log.rows[-1].time_us == 93457
    assert log.failed_at == (39, "Test NCCL failure common.cu:1204 'unhandled cuda error (run with "
                                 "NCCL_DEBUG=INFO for details) / '")  # fmt: skip
    assert "using its 5 rows up to 16G" in log.notes()[0]
    r = cli("collective", "--cluster", "dgx-h100-ib", "--calibrate", str(R322))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "it was cut" in r.stderr


# ---- several runs in one file ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("first", "second"),
    # two node counts; all_reduce then all_gather
    [(N2, N4), (N4, DATA / "h200gke_n2_skypilot_all_gather.log")],
)
def test_two_runs_in_one_file_split_where_the_message_says(tmp_path, first, second):
    """Two runs back to back (a sweep script's one output file) stay refused, and the message's commands
    split the file so that each part reads as its original: the second run's command line and launcher
    lines go with it. Before: 'split the log at line N' named the '# nThread' line, which left the
    second run's 'mpirun ... all_reduce_perf' line (its op) in the first part."""
    text = first.read_text() + second.read_text()
    with pytest.raises(ParseError) as err:
        parse_log(write(tmp_path, "both.log", text))
    split = r"\(head -n (\d+) both\.log > run1\.log; tail -n \+(\d+) both\.log > run2\.log\)"
    m = re.search(split, str(err.value))
    assert m is not None, str(err.value)
    lines = text.splitlines(keepends=True)
    one = write(tmp_path, "run1_" + first.name, "".join(lines[: int(m[1])]))
    two = write(tmp_path, "run2_" + second.name, "".join(lines[int(m[2]) - 1 :]))
    assert summary(parse_log(one)) == summary(parse_log(first))
    assert summary(parse_log(two)) == summary(parse_log(second))


def test_real_multi_run_file_splits_where_the_message_says(cli, tmp_path):
    """A real file with several runs (xxrjun/nccl-tests-cluster, data/README.md): all_reduce then all_gather
    on 10 H100 nodes, one GPU each, nccl-tests 2.17.8. ``parse_log`` (one run) still refuses it and names
    the split line; the CLI reads it, one log per run (tests/fabric/test_multi_run.py). Before: refused
    through the CLI in one line. The parts the message names read as one run each."""
    real = DATA / "h100xx_n10_g1_multi_run.log"
    with pytest.raises(ParseError) as err:
        parse_log(real)
    msg = str(err.value)
    assert "multi_run.log:38: a second nccl-tests run starts here" in msg
    assert "split the log at line 36 (head -n 35 h100xx_n10_g1_multi_run.log > run1.log; tail" in msg
    r = cli("collective", "--calibrate", str(real), "--nodes", "10")
    assert r.returncode == 0, r.stderr
    assert "h100xx_n10_g1_multi_run.log: 2 nccl-tests runs" in r.stderr
    lines = real.read_text().splitlines(keepends=True)
    one = parse_log(write(tmp_path, "run1.log", "".join(lines[:35])))
    two = parse_log(write(tmp_path, "run2.log", "".join(lines[35:])))
    assert (one.op, one.nodes, one.gpus_per_node, len(one.rows), one.rows[-1].time_us) == (
        "all_reduce", 10, 1, 10, 632480
    )
    assert (two.op, two.nodes, len(two.rows), two.rows[0].size, two.avg_busbw) == (
        "all_gather", 10, 10, 33554400, 46.7949
    )


def test_nodes_sharing_one_host_name_are_named_in_the_message(cli, tmp_path):
    """Every rank line on one host name (containers named alike): 16 ranks read as one 16-GPU node. The
    refusal now says why the GPU count may be wrong. Before: only '16 GPUs per node, but cluster ... has
    8'."""
    same = [re.sub(r"on\s+\S+\s+device", "on localhost device", x) for x in lines_of(N2)]
    r = cli("collective", "--calibrate", str(write(tmp_path, "h_all_reduce.log", "\n".join(same))))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "16 GPUs per node, but cluster 'dgx-h100-ib' has 8" in r.stderr
    assert "its 16 ranks are on 1 host name(s): if several nodes share a host name" in r.stderr


def test_compressed_logs_and_a_folder(tmp_path):
    """Archived job logs (.log.gz, .bz2, .xz) read as their text; a cut archive and a folder are one line.
    Before: compressed bytes gave 'no nccl-tests result table found'; a folder 'cannot read (Is a
    directory)'."""
    import bz2
    import gzip
    import lzma

    raw = N4.read_bytes()
    for name, data in (("a.log.gz", gzip.compress(raw)), ("a.log.bz2", bz2.compress(raw)),
                       ("a.log.xz", lzma.compress(raw))):  # fmt: skip
        p = tmp_path / name
        p.write_bytes(data)
        assert summary(parse_log(p)) == summary(parse_log(N4))
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(gzip.compress(raw)[:500])
    with pytest.raises(ParseError, match=r"cut\.log\.gz: a gzip file that does not decompress"):
        parse_log(cut)
    with pytest.raises(ParseError, match=r": a folder; give the nccl-tests logs in it"):
        parse_log(tmp_path)


def test_cli_compare_log_that_failed_mid_table_says_so(cli, tmp_path, data_dir):
    """--compare with the 8-node log cut by a failure line after its 2 GiB row: the score uses the 7 rows
    from 32 MiB to 2 GiB and a note says the run failed. Before: the same score with no word of the rest."""
    n8 = lines_of(data_dir / "h100ib_n8_all_reduce.log")
    fail = "b749a9b0: Test NCCL failure common.cu:1005 'unhandled system error'"
    held = write(tmp_path, "n8_all_reduce.log", failed_after(n8, 12, fail))
    r = cli("collective", "--calibrate", str(N2), str(N4), "--compare", str(held), "--nodes", "8", "--sizes",
            "1G", "--format", "json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "note: n8_all_reduce.log:84: the run failed here" in r.stderr and "12 rows up to 2G" in r.stderr
    assert "compared with 7 measured rows (32 MB-8 GB) of 1 log(s)" in r.stderr


def test_rccl_tests_output_files_are_refused_with_the_reason(tmp_path):
    """rccl-tests -x FILE -Z json|csv (ROCm/rccl-tests src/common.cu, Reporter): one record per size and
    in/out-of-place, keys and order as Reporter::addResult writes them with MPI, values of the 4-node log's
    first row; its 'nodes' is totalProcs / nProcs (1 here) and no host is named, so the node count cannot be
    told. Before: json said 'a killed run leaves it cut off', csv 'no nccl-tests result table found'."""
    rec = ('{{"name":"AllReduce", "nodes":1, "ranks":32, "ranksPerNode":32, "gpusPerRank":1, '
           '"size":1048576, "type":"float", "redop":"sum", "inPlace":{}, "time":{:f}, "algBw":{:f}, '
           '"busBw":{:f}, "wrong":"0"}}')
    lines = [rec.format(0, 317.0, 3.31, 6.41), rec.format(1, 93.26, 11.24, 21.78)]
    with pytest.raises(ParseError, match=r"r\.json: an rccl-tests -x/-Z output file; it names no host"):
        parse_log(write(tmp_path, "r.json", "\n".join(lines) + "\n"))
    csv = ("collective, ranks, rankspernode, gpusperrank, size, type, redop, inplace, time, algbw, busbw, "
           '#wrong\n"AllReduce", 32, 32, 1, 1048576, "float", "sum", 0, 317.000000, 3.310000, 6.410000, '
           '"0"\n')
    with pytest.raises(ParseError, match=r"r\.csv: an rccl-tests -x/-Z output file"):
        parse_log(write(tmp_path, "r.csv", csv))


def test_rccl_tests_in_place_only_table(tmp_path):
    """rccl-tests -O 0 (enable_out_of_place = 0 in ROCm/rccl-tests src/common.cu): the header names one
    'in-place' block (time algbw busbw #wrong) and each row holds only it. Built from the 4-node log. Read
    as in-place numbers, with the note."""
    out = []
    for x in lines_of(N4):
        if "out-of-place" in x:
            x = "#                                                      in-place          "
        elif re.search(r"\bsize\s+count\s+type\s+redop\b", x):
            x = "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        elif "(elements)" in x:
            x = "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)      "
        elif is_row(x):
            f = x.split()
            x = f"{f[0]:>12}  {f[1]:>12}  {f[2]:>8}  {f[3]:>6}  {f[4]:>6}  " + "  ".join(f[9:])
        out.append(x)
    log = parse_log(write(tmp_path, "o0.log", "\n".join(out)))
    clean = parse_log(N4).rows
    assert [(r.size, r.time_us) for r in log.rows] == [(r.size, r.inplace_time_us) for r in clean]
    assert log.inplace_only_rows == 14 and "in-place times are used" in log.notes()[0]


def test_complete_rank_list_on_devices_4_to_7_is_read(tmp_path):
    """NCCL_TESTS_DEVICE=4 (src/common.cu: cudaDev = gpu0 + i): one node, 4 ranks on devices 4..7. The
    cut-list check must not take the device indices for a node's GPU count when every rank is listed. Built
    from the 2-node log's first host."""
    one = [x for x in lines_of(N2) if not re.search(r"Rank\s+([4-9]|1\d)\b", x)]
    shift = lambda m: f"device  {int(m[1]) + 4}"  # noqa: E731
    one = [re.sub(r"device\s+(\d)", shift, x) if "Rank" in x else x for x in one]
    log = parse_log(write(tmp_path, "dev4.log", "\n".join(one)))
    assert (log.nranks, log.nodes, log.gpus_per_node) == (4, 1, 4) and log.rows == parse_log(N2).rows
    short = [x for x in lines_of(N2) if not re.search(r"Rank\s+1[2-5]\b", x)]  # the last host lists 4 of 8
    with pytest.raises(ParseError, match=r"s\.log:\d+: the rank list stops at rank 11, inside host b749a9b0 "
                                         r"\(4 of the 8 .*\) or the last node ran fewer ranks"):  # fmt: skip
        parse_log(write(tmp_path, "s.log", "\n".join(short)))
