"""fabricpace collective through the real entry point: node counts against the cluster's size."""

from __future__ import annotations

import json

from fabricpace.fabric import load_cluster


def test_default_node_counts_stop_at_the_clusters_size(cli, tmp_path):
    # A user's own 12-node cluster file: the default 2,4,8,16,32 used to fail at 16.
    text = load_cluster("p5-efa").to_yaml().replace("nodes: 256", "nodes: 12", 1)
    path = tmp_path / "small.yaml"
    path.write_text(text)
    r = cli("collective", "--cluster", str(path), "--sizes", "1G", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert [row["nodes"] for row in json.loads(r.stdout)] == [2, 4, 8]


def test_too_many_nodes_names_the_option_and_the_limit(cli):
    r = cli("collective", "--cluster", "single-switch", "--nodes", "2,64", "--sizes", "1G")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "fabricpace: error: --nodes 2,64: cluster 'single-switch' has 32 nodes; ask for at most 32, "
        "or use a cluster file with more (docs/cluster-files.md)"
    ]
    assert r.stdout == ""


def test_calibrate_glob_form_equals_the_repeated_form(cli):
    # `--calibrate logs/*.log` reaches the program as `--calibrate n2.log n4.log`: one fit on both.
    from pathlib import Path

    data = Path(__file__).resolve().parents[1] / "fabric" / "data"
    a, b = str(data / "h100ib_n2_all_reduce.log"), str(data / "h100ib_n4_all_reduce.log")
    common = ("collective", "--nodes", "8", "--sizes", "1G", "--format", "json")
    glob = cli(*common, "--calibrate", a, b)
    repeated = cli(*common, "--calibrate", a, "--calibrate", b)
    assert glob.returncode == 0 and repeated.returncode == 0, glob.stderr
    assert json.loads(glob.stdout) == json.loads(repeated.stdout)
    assert "from 2 logs" in glob.stderr
    stray = cli(*common, a)  # a log without --calibrate is still a mistake
    assert stray.returncode == 2 and "unexpected argument(s)" in stray.stderr


def test_calibrating_on_another_collective_gets_a_note(cli):
    from pathlib import Path

    log = str(Path(__file__).resolve().parents[1] / "fabric" / "data" / "h100ib_n2_all_reduce.log")
    r = cli("collective", "--op", "all_gather", "--nodes", "8", "--sizes", "1G", "--calibrate", log)
    assert r.returncode == 0, r.stderr
    assert "calibrated on all_reduce logs but predicting all_gather" in r.stderr
    same = cli("collective", "--op", "all_reduce", "--nodes", "8", "--sizes", "1G", "--calibrate", log)
    assert "but predicting" not in same.stderr


def _data():  # type: ignore[no-untyped-def]
    from pathlib import Path

    return Path(__file__).resolve().parents[1] / "fabric" / "data"


def test_compare_scores_held_out_logs_as_the_json_predictions_do(cli):
    import re

    import numpy as np

    from fabricpace.fabric.nccl_tests import parse_log

    d = _data()
    fit = ("--calibrate", str(d / "h100ib_n2_all_reduce.log"), str(d / "h100ib_n4_all_reduce.log"))
    held = parse_log(d / "h100ib_n8_all_reduce.log")
    rows = [r for r in held.rows if (32 << 20) <= r.size <= (8 << 30)]
    sizes = ",".join(str(r.size) for r in rows)
    scored = cli("collective", "--nodes", "8", "--sizes", "1G", *fit, "--compare", held.path)
    assert scored.returncode == 0, scored.stderr
    pattern = r"compared with (\d+) measured rows .* median ([\d.]+)%, worst ([+-][\d.]+)%"
    m = re.search(pattern, scored.stderr)
    assert m, scored.stderr
    # The same predictions through --format json, scored here against the log's out-of-place times.
    pred = cli("collective", "--nodes", "8", "--sizes", sizes, *fit, "--format", "json")
    times = {p["bytes"]: p["time_us"] for p in json.loads(pred.stdout)}
    err = np.array([times[r.size] / r.time_us - 1 for r in rows])
    assert int(m.group(1)) == len(rows) == 9
    assert float(m.group(2)) == round(100 * float(np.median(np.abs(err))), 1)
    assert float(m.group(3)) == round(100 * float(err[np.argmax(np.abs(err))]), 1)

    wrong = cli("collective", "--compare", str(d / "h200gke_n2_skypilot_all_gather.log"))
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "all_gather" in wrong.stderr


def test_plot_draws_model_lines_and_measured_rows_and_never_overwrites(cli, tmp_path):
    import re

    from fabricpace.fabric.nccl_tests import parse_log

    d = _data()
    out = tmp_path / "busbw.html"
    args = ("collective", "--nodes", "2,4,8", "--calibrate", str(d / "h100ib_n2_all_reduce.log"),
            str(d / "h100ib_n4_all_reduce.log"), "--compare", str(d / "h100ib_n8_all_reduce.log"),
            "--plot", str(out), "--format", "json")
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)  # stdout stays the JSON alone
    html = out.read_text()
    assert "plotly" in html and "<script" in html  # plotly.js embedded: opens offline
    names = re.findall(r'"name":"([^"]+)"', html)
    for n in (2, 4, 8):
        assert f"{n} nodes, model" in names
    assert "2 nodes, measured, fitted" in names and "8 nodes, measured, not fitted" in names
    assert "8 nodes, measured, fitted" not in names
    # The held-out markers are the log's own busbw values.
    n8 = parse_log(d / "h100ib_n8_all_reduce.log")
    assert f"{n8.rows[-1].busbw}" in html
    before = out.read_bytes()
    again = cli(*args)
    assert again.returncode == 2 and "exists" in again.stderr and again.stdout == ""
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["busbw.html"]


def test_far_extrapolation_gets_a_note_with_the_validation_errors(cli):
    d = _data()
    fit = ("--calibrate", str(d / "h100ib_n2_all_reduce.log"), str(d / "h100ib_n4_all_reduce.log"))
    near = cli("collective", "--nodes", "8", "--sizes", "1G", *fit)
    far = cli("collective", "--nodes", "8,32", "--sizes", "1G", *fit, "--format", "json")
    assert near.returncode == 0 and far.returncode == 0, far.stderr
    assert "beyond" not in near.stderr  # 2x the calibration's largest node count: no note
    note = [line for line in far.stderr.splitlines() if line.startswith("note: predicting up to 32 nodes")]
    assert len(note) == 1 and "from logs of at most 4 nodes (8x beyond)" in note[0] and "--compare" in note[0]
    assert [row["nodes"] for row in json.loads(far.stdout)] == [8, 32]  # stdout stays the JSON alone


def test_files_after_compare_are_scored_not_fitted(cli):
    # `--compare n4.log n8.log` (or a glob) used to hand n8.log to the fit: an in-sample score shown as
    # held out.
    d = _data()
    n2, n4, n8 = (str(d / f"h100ib_n{n}_all_reduce.log") for n in (2, 4, 8))
    common = ("collective", "--nodes", "8", "--sizes", "1G", "--calibrate", n2)
    spaced = cli(*common, "--compare", n4, n8)
    repeated = cli(*common, "--compare", n4, "--compare", n8)
    assert spaced.returncode == 0 and repeated.returncode == 0, spaced.stderr
    assert "from 1 log:" in spaced.stderr and "of 2 log(s)" in spaced.stderr
    assert spaced.stdout == repeated.stdout and spaced.stderr == repeated.stderr


def test_a_log_both_fitted_and_compared_is_refused(cli, refused):
    d = _data()
    n2, n8 = (str(d / f"h100ib_n{n}_all_reduce.log") for n in (2, 8))
    r = cli("collective", "--nodes", "8", "--sizes", "1G", "--calibrate", n2, n8, "--compare", n8)
    msg = refused(r)
    assert "also given to --calibrate" in msg and "h100ib_n8_all_reduce.log" in msg


def test_a_second_value_after_a_one_value_option_is_named(cli, refused):
    d = _data()
    n2, n4 = (str(d / f"h100ib_n{n}_all_reduce.log") for n in (2, 4))
    msg = refused(cli("collective", "--calibrate", n2, n4, "--nodes", "8", "16", "--sizes", "1G"))
    assert "unexpected argument(s) 16 after --nodes" in msg and "--nodes A,B" in msg
    # flags consume no value: a glob after --explain ... --calibrate still fits both logs
    ok = cli("collective", "--explain", "--nodes=8", "--sizes", "1G", "--calibrate", n2, n4)
    assert ok.returncode == 0 and "from 2 logs" in ok.stderr, ok.stderr


def test_arguments_after_double_dash_are_named_as_such(cli, refused, tmp_path):
    # They were reported "after --sizes, which takes one value", the option before '--'.
    r = cli("collective", "--nodes", "4", "--sizes", "1G", "--", "extra.log")
    refused(r, "extra.log after '--'", "--calibrate or --compare")


def test_compare_prints_a_line_per_log_and_the_score_without_degraded_ones(cli):
    # The pooled median of three held-out Alps logs (15.7%) hid that one log, a degraded job (64 MiB in
    # 81% of the time of 1 GiB), made the worst rows; a line per log says which (audit 18, H1).
    from pathlib import Path

    data = Path(__file__).resolve().parents[1] / "fabric" / "data"
    fit = [str(data / f"alpscfg2_n{n}_all_reduce.txt") for n in (2, 4)]
    held = [str(data / f"alpscfg2_n{n}_all_reduce.txt") for n in (8, 16, 32)]
    r = cli("collective", "--cluster", str(data / "alps.yaml"), "--gpus-per-node", "4", "--nodes", "8",
            "--sizes", "1G", "--calibrate", *fit, "--compare", *held)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("compared with 24 measured rows"))
    per_log = lines[first + 1:first + 5]
    assert [ln.split(" (")[0].strip() for ln in per_log[:3]] == [Path(p).name for p in held]
    assert "(8 nodes, 8 rows)" in per_log[0] and "degraded (see its note)" in per_log[0]
    assert all("degraded" not in ln for ln in per_log[1:3])
    assert per_log[3].startswith("  without the degraded log(s): 16 rows, time error median")
