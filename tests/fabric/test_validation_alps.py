"""CSCS Alps GH200 (4 GH200 + 4 Slingshot-11 per node) held out at 8, 16 and 32 nodes (audit 18, H1): the
campaign's tables (tests/fabric/data/README.md, cluster 4) read as published, the model fitted on the
2- and 4-node tables and scored on the larger ones, and the fit summary naming its worst row."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from fabricpace.fabric import collective_time, load_cluster
from fabricpace.fabric.calibrate import calibrate_cluster, points_from_logs
from fabricpace.fabric.nccl_tests import parse_log
from fabricpace.fabric.nccl_tests_layout import LayoutHint

DATA = Path(__file__).parent / "data"
HINT = LayoutHint(gpus_per_node=4, source="test")
CAL = [DATA / "alpscfg2_n2_all_reduce.txt", DATA / "alpscfg2_n4_all_reduce.txt"]
# run_0000 at 16 and 32 nodes, run_0001 at 8 nodes (run_0000's 8-node job is degraded: see below)
HELD = [DATA / f"alpscfg2{name}_all_reduce.txt" for name in ("r1_n8", "_n16", "_n32")]
DEGRADED = DATA / "alpscfg2_n8_all_reduce.txt"

# (file, nodes, 4 GiB out-of-place time in us, 32 MiB out-of-place time in us), as published
PINNED = [
    (DATA / "alpscompat0_n2_all_reduce.txt", 2, 47482.0, 634.9),
    (DATA / "alpscompat0_n8_all_reduce.txt", 8, 91059.0, 4425.3),
    (DATA / "alpscompat0_n16_all_reduce.txt", 16, 92364.0, 1645.4),
    (DATA / "alpscompat0_n32_all_reduce.txt", 32, 92235.0, 3453.8),
    (DEGRADED, 8, 90174.0, 25774.0),
    (HELD[0], 8, 90236.0, 2730.3),
    (HELD[1], 16, 91996.0, 1663.9),
    (HELD[2], 32, 93866.0, 1920.2),
]


@pytest.mark.parametrize(("path", "nodes", "t4g", "t32m"), PINNED, ids=lambda v: getattr(v, "name", None))
def test_alps_held_out_tables_parse_as_published(path, nodes, t4g, t32m):
    log = parse_log(path, hint=HINT)
    assert (log.op, log.nodes, log.gpus_per_node, log.nranks) == ("all_reduce", nodes, 4, 4 * nodes)
    assert [r.size for r in log.rows] == [8 << k for k in range(30)]  # -b 8 -e 4294967296 -f 2
    by_size = {r.size: r for r in log.rows}
    assert (by_size[4 << 30].time_us, by_size[32 << 20].time_us) == (t4g, t32m)
    ranks = 4 * nodes
    for r in log.rows:
        if r.size >= 1 << 20:  # algbw = S / t and busbw = algbw * 2(n-1)/n, to the printed two decimals
            assert r.algbw == pytest.approx(r.size / r.time_us / 1e3, abs=0.011)
            assert r.busbw == pytest.approx(r.algbw * 2 * (ranks - 1) / ranks, abs=0.02 + 0.001 * r.busbw)


def test_alps_fit_on_2_and_4_nodes_predicts_8_16_32_nodes():
    """Issue 2's protocol on a fourth cluster: fitted on the 2- and 4-node tables only. Bandwidth-bound
    sizes (512 MiB-4 GiB) within 8% everywhere (max 6.9% at 32 nodes, 512 MiB, when written); the median
    over 32 MiB-4 GiB within 6% (4.6%). The 32-256 MiB rows of the larger jobs step (e.g. 64-256 MiB all at
    ~5.5-5.9 ms on 16 nodes), which nothing at 2 and 4 nodes shows: the worst rows miss by up to 65%."""
    fit = calibrate_cluster(load_cluster(DATA / "alps.yaml"), CAL, op="all_reduce", hint=HINT)
    test = points_from_logs([parse_log(p, hint=HINT) for p in HELD])
    model = np.array([
        collective_time(fit.cluster, "all_reduce", int(s), nodes=int(n)).time_s
        for s, n in zip(test.nbytes, test.nodes, strict=True)
    ])
    err = np.abs(model / test.time_s - 1) * 100
    big = test.nbytes >= 512 << 20
    assert sorted(set(test.nodes.tolist())) == [8, 16, 32] and big.sum() == 12
    assert err[big].max() <= 8.0, err[big]
    assert np.median(err) <= 6.0, np.median(err)


def test_alps_degraded_8_node_job_is_the_measurement_not_the_model():
    """run_0000's 8-node job is 9x slower at 32 MiB than run_0001's job of the same configuration and node
    count, and 2x slower at 1 GiB, while both agree within 1% at 4 GiB: compared with it the model misses
    by 95%, which says nothing about the model (docs/cluster-files.md)."""
    bad, good = (parse_log(p, hint=HINT) for p in (DEGRADED, HELD[0]))
    t_bad = {r.size: r.time_us for r in bad.rows}
    t_good = {r.size: r.time_us for r in good.rows}
    assert t_bad[32 << 20] / t_good[32 << 20] > 9
    assert t_bad[1 << 30] / t_good[1 << 30] > 1.7
    assert abs(t_bad[4 << 30] / t_good[4 << 30] - 1) < 0.01


def test_fit_summary_names_its_worst_row(cli):
    """The 2-node table's 4 GiB row runs at 1.9x the algbw of its 2 GiB row (84.18 against 45.38 GB/s),
    which no fit follows: the summary names that row, signed, as --compare names its worst row."""
    fit = calibrate_cluster(load_cluster(DATA / "alps.yaml"), CAL, op="all_reduce", hint=HINT)
    assert fit.worst_row is not None
    err, nodes, size = fit.worst_row
    assert (nodes, size) == (2, 4 << 30) and err > 0 and abs(err) == pytest.approx(fit.max_error_pct)
    r = cli("collective", "--cluster", str(DATA / "alps.yaml"), "--calibrate", *map(str, CAL), "--nodes",
            "8", "--sizes", "1G")
    assert r.returncode == 0, r.stderr
    assert f"worst {err:+.1f}% (4G on 2 nodes)" in r.stderr


# ---- a degraded job says so: its time stops growing with the size (NcclTestsLog.stalled_pair) -----------
# the other configuration's 32-node job (FI_CXI_COMPAT_0, run_0000): 256 MiB..2 GiB all take 89-101 ms
COMPAT0_N32 = DATA / "alpscompat0_n32_all_reduce.txt"


@pytest.mark.parametrize(
    ("path", "small", "big", "text"),
    [
        (DEGRADED, 64 << 20, 1 << 30, "64M took 32443 us, 81% of the 40056 us of 1G (16x the bytes)"),
        (COMPAT0_N32, 256 << 20, 4 << 30, "256M took 94691 us, 103% of the 92235 us of 4G (16x the bytes)"),
    ],
)
def test_a_degraded_job_is_named_in_its_notes(path, small, big, text):
    log = parse_log(path, hint=HINT)
    pair = log.stalled_pair()
    assert pair is not None and (pair[0].size, pair[1].size) == (small, big)
    note = next(n for n in log.notes() if "degraded" in n)
    assert text in note and "rerun the job before fitting or comparing with it" in note


def test_no_clean_log_of_the_validation_data_is_called_degraded():
    """Every other log here, healthy or not (Polaris all-gather at 256 and 540 nodes is latency-bound at
    32 MiB-1 GiB of total size, and is checked per rank), reads without the note."""
    from fabricpace.fabric.nccl_tests_runs import parse_logs

    flagged, read = [], 0
    for path in sorted(DATA.iterdir()):
        if path.suffix not in (".log", ".out", ".txt") or "failed" in path.name:
            continue
        for log in parse_logs(path, hint=HINT):
            read += 1
            if log.stalled_pair() is not None:
                flagged.append(path.name)
    assert read >= 25
    assert flagged == [DEGRADED.name, COMPAT0_N32.name]


def test_compare_with_a_degraded_job_says_it_is_the_run(cli):
    r = cli("collective", "--cluster", str(DATA / "alps.yaml"), "--calibrate", *map(str, CAL), "--compare",
            str(COMPAT0_N32), "--nodes", "32", "--sizes", "4G")
    assert r.returncode == 0, r.stderr
    assert "alpscompat0_n32_all_reduce.txt: 256M took 94691 us" in r.stderr
    assert re.search(r"worst -9\d\.\d% \(256M on 32 nodes\)", r.stderr), r.stderr


# ---- the campaign's own file names: Slurm's -n (tasks) and -N (nodes), case and all ---------------------
def test_the_campaigns_own_table_names_give_nodes_and_ranks(tmp_path):
    """Before, 'job-n-00008-N-0002.txt' (the name the campaign gave the 2-node table) was refused for want
    of a node count, and the tables had to be renamed (audit 17). The case tells Slurm's -n from -N."""
    from fabricpace.fabric.nccl_tests import _nodes_from_name

    named = tmp_path / "job-n-00008-N-0002.txt"
    named.write_bytes(CAL[0].read_bytes())
    log = parse_log(named, op="all_reduce")  # no hint: the name gives GPUs per node too
    assert (log.nodes, log.nranks, log.gpus_per_node) == (2, 8, 4)
    assert log.assumed == (
        "no '#  Rank' lines: 2 nodes and 8 ranks (4 per node) from the file name (Slurm's -N and -n)"
    )
    assert [_nodes_from_name(n) for n in ("x-N8-n32.txt", "n_4.log", "n4_all_reduce.log")] == [8, None, 4]
    assert _nodes_from_name("job-n-00030-N-0008.txt") is None  # 30 tasks cannot spread evenly on 8 nodes


def test_compare_reads_the_campaigns_own_table_names(cli, tmp_path):
    for src, name in ((CAL[0], "job-n-00008-N-0002.txt"), (CAL[1], "job-n-00016-N-0004.txt"),
                      (HELD[1], "job-n-00064-N-0016.txt")):
        (tmp_path / name).write_bytes(src.read_bytes())
    r = cli("collective", "--cluster", str(DATA / "alps.yaml"), "--op", "all_reduce", "--calibrate",
            str(tmp_path / "job-n-00008-N-0002.txt"), str(tmp_path / "job-n-00016-N-0004.txt"), "--compare",
            str(tmp_path / "job-n-00064-N-0016.txt"), "--nodes", "16", "--sizes", "1G")
    assert r.returncode == 0, r.stderr
    assert "job-n-00064-N-0016.txt: no '#  Rank' lines: 16 nodes and 64 ranks (4 per node)" in r.stderr
    assert "compared with 8 measured rows" in r.stderr


def test_import_of_a_rankless_table_names_the_fix(cli, refused, tmp_path):
    """`import nccl-tests` of the 16-node table said only "cannot tell the number of ranks"; the file name
    gives the nodes, so the refusal now names the missing GPUs per node and the option that gives them."""
    r = cli("import", "nccl-tests", str(HELD[1]), "-o", str(tmp_path / "a"))
    refused(r, "alpscfg2_n16_all_reduce.txt", "16 nodes from the file name", "--gpus-per-node")
    named = tmp_path / "job-n-00064-N-0016.txt"  # the campaign's own name gives both counts
    named.write_bytes(HELD[1].read_bytes())
    r = cli("import", "nccl-tests", str(named), "-o", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    assert "64 ranks, 30 steps" in r.stdout + r.stderr


# ---- LL128 across nodes and the overlapped proxy floor (tuning.ll128_across_nodes, tuning.ring_floor) ----
def _no_ll128():
    return load_cluster(DATA / "alps.yaml").with_tuning(ll128_across_nodes=False)


def test_ll128_across_nodes_off_leaves_ll128_inside_a_node_only():
    from fabricpace.fabric.collectives import candidate_plans

    cl = _no_ll128()
    assert ("ring", "LL128") in candidate_plans(cl, "all_reduce", 1, 4)
    assert {p for _, p in candidate_plans(cl, "all_reduce", 8, 4)} == {"LL", "Simple"}
    assert collective_time(cl, "all_reduce", 64 << 20, nodes=16).protocol == "Simple"
    forced = collective_time(cl, "all_reduce", 64 << 20, nodes=16, protocol="LL128")  # NCCL_PROTO still can
    assert forced.protocol == "LL128"


def test_fast_model_equals_collective_time_with_the_floor_overlapped():
    from fabricpace.fabric.calibrate import FastModel

    values = dict(net_efficiency=0.95, tree_efficiency=0.5, nvls_tree_efficiency=0.8, base_us=300.0,
                  net_overhead_us=10.0)
    cl = _no_ll128().with_tuning(**values, ring_floor="overlapped")
    pts = points_from_logs([parse_log(p, hint=HINT) for p in [*CAL, *HELD]], min_bytes=1 << 20)
    fast = FastModel(cl, pts).times(**values, ring_floor="overlapped")
    slow = [collective_time(cl, "all_reduce", s, nodes=int(n)).time_s
            for s, n in zip(pts.nbytes, pts.nodes, strict=True)]
    np.testing.assert_allclose(fast, slow, rtol=1e-12)
    added = FastModel(cl, pts).times(**values)  # the floor hides data: never slower than floor + data
    assert np.all(fast <= added * (1 + 1e-12)) and np.any(fast < added * 0.9)


def test_alps_without_ll128_across_nodes_fits_the_overlapped_floor_and_predicts_within_28_percent():
    """The 4-node rows of 32 and 64 MiB take 1.29 and 1.43 ms (a floor, not a bandwidth); a floor added to
    the data cannot fit them, a floor the data hides can: the fit keeps ``overlapped`` (loss 0.342 against
    0.371). Held-out 8/16/32 nodes: 4.7% median, 27.2% worst when written (64.5% with LL128 and the added
    floor); every 512 MiB-4 GiB row within 8%."""
    fit = calibrate_cluster(_no_ll128(), CAL, op="all_reduce", hint=HINT)
    assert fit.cluster.tuning.ring_floor == "overlapped"
    assert "ring steps overlap their data with the proxy floor" in fit.summary()
    test = points_from_logs([parse_log(p, hint=HINT) for p in HELD])
    model = np.array([collective_time(fit.cluster, "all_reduce", int(s), nodes=int(n)).time_s
                      for s, n in zip(test.nbytes, test.nodes, strict=True)])
    err = np.abs(model / test.time_s - 1) * 100
    assert err.max() <= 28.0 and np.median(err) <= 5.0, err
    assert err[test.nbytes >= 512 << 20].max() <= 8.0


def test_the_headline_fits_keep_the_added_floor(data_dir):
    """On the H100 IB logs the overlapped floor fits worse in-sample: the fit keeps NCCL's added form, so
    benchmarks/collective_accuracy.py's headline is unchanged."""
    logs = [parse_log(data_dir / f"h100ib_n{n}_all_reduce.log") for n in (2, 4)]
    fit = calibrate_cluster(load_cluster("dgx-h100-ib"), logs)
    assert fit.cluster.tuning.ring_floor == "added" and "overlap" not in fit.summary()


def test_a_time_set_by_the_overlapped_floor_names_no_link():
    """H1 (audit 18): the bottleneck column named the NIC where the ring-step floor set the time."""
    cl = _no_ll128().with_tuning(net_overhead_us=40.0, ring_floor="overlapped")
    small = collective_time(cl, "all_reduce", 32 << 20, nodes=16, algorithm="ring")
    big = collective_time(cl, "all_reduce", 8 << 30, nodes=16, algorithm="ring")
    assert small.bottleneck == "ring-step floor (latency)" and small.bottleneck_flows == 0
    assert "nic" in big.bottleneck  # the data, not the floor, sets an 8 GiB ring's time
    added = collective_time(cl.with_tuning(ring_floor="added"), "all_reduce", 32 << 20, nodes=16,
                            algorithm="ring")
    assert "floor" not in added.bottleneck  # the added form: the data's link still names the bottleneck
