"""Audit 17 (A4), the place -> lab -> diagnose loop: the diagnosis of real lab runs against the lab's own
fabric, and the same situations generated with the simulator.

Recorded runs (``data/real``, the auditor's lab run directories compacted to manifest, ranks, steps and
collectives; 4 ranks, one per node, 2 leaves, gloo): ``audit17-lab-throttled`` (shipped
``throttled-rank``: rank 1 at 0.03 CPU, 200 Mbit/s uplinks), ``audit17-lab-slow-contig`` /
``-slow-inter`` (20 Mbit/s uplinks, the only fault, contiguous / interleaved placement: 305 / 559 ms per
step), ``audit17-lab-congested`` (shipped ``congested-uplink``: interleaved, 8 foreign TCP streams on for
1.5 s of every 3 s; transfers 207.8 ms in the on-periods, 47.6 ms off), ``audit17-lab-healthy``. Cluster
files (``data/clusters/lab-200m.yaml``, ``lab-20m.yaml``) mirror the lab: 4 nodes x 1 GPU, 1 Gbit NICs,
2 nodes per leaf, one spine, 200 / 20 Mbit/s uplinks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fabricpace import sim
from fabricpace.cli.app import app
from fabricpace.diagnose import diagnose
from fabricpace.study import load_scenario

DATA = Path(__file__).parent / "data"
SWEEP_LEFT_OUT = "nccl-tests size sweep: one step per message size, not a training run"
CLUSTERS = DATA / "clusters"


def _run(name: str) -> Path:
    return DATA / "real" / f"audit17-lab-{name}"


def _modes(d) -> list[str]:  # type: ignore[no-untyped-def]
    return [f.mode for f in d.findings]


# Finding 1: a CPU-starved gloo rank slows the ring itself; the uplink is healthy.


def test_throttled_rank_is_not_blamed_on_the_uplink_with_the_lab_cluster_file() -> None:
    # Before: topology_contention 29.5% on leaf0<->leaf1 ("×3.44 vs fabric model; everywhere") ranked
    # above the straggler; the lab's healthy run on the same 200 Mbit/s uplinks moves 22.5 ms per
    # all-reduce against the model's 25.9 ms.
    d = diagnose(_run("throttled"), cluster=CLUSTERS / "lab-200m.yaml")
    assert _modes(d) == ["persistent_straggler"]
    assert d.findings[0].culprits.ranks == [1]
    why = next(a.reason for a in d.abstained if a.mode == "topology_contention")
    assert "rank 1" in why and "×3.44" in why and "no link is named" in why
    # the same run without the cluster file, and the healthy control with it, are unchanged
    assert _modes(diagnose(_run("throttled"))) == ["persistent_straggler"]
    assert diagnose(_run("healthy"), cluster=CLUSTERS / "lab-200m.yaml").runs[0].verdict == "healthy"


def test_a_straggler_explains_uniform_excess_only_where_the_cpu_reduces(tmp_path) -> None:
    # Review of audit 17: the same run recorded under NCCL (a GPU ring its host's compute does not slow)
    # keeps topology_contention beside the straggler; a run that records gloo, as the lab does, does not.
    for backend, contention in (("nccl", True), ("cpu:gloo,cuda:nccl", True), ("gloo", False)):
        run = tmp_path / backend.replace(":", "_").replace(",", "_")
        shutil.copytree(_run("throttled"), run)
        man = json.loads((run / "manifest.json").read_text())
        man["extra"]["process_group_backend"] = backend
        (run / "manifest.json").write_text(json.dumps(man))
        modes = _modes(diagnose(run, cluster=CLUSTERS / "lab-200m.yaml"))
        assert ("topology_contention" in modes) is contention, (backend, modes)
        assert "persistent_straggler" in modes


def test_a_straggler_does_not_hide_contention_concentrated_on_cross_leaf_groups(synth) -> None:
    # The rule only withholds uniform excess against the model: cross-leaf pairs 3x slower than the
    # intra-leaf ones stay topology_contention beside a slow rank.
    run = synth(
        "a17_cross_and_slow", ranks=16, steps=120, pair_groups=True, cross_leaf_factor=3.0,
        slow_ranks=(5,), slow_factor=1.25,
    )
    d = diagnose(run)
    assert "topology_contention" in _modes(d) and "persistent_straggler" in _modes(d)
    strag = next(f for f in d.findings if f.mode == "persistent_straggler")
    assert strag.culprits.ranks == [5]


# Finding 2: microseconds of data time are not an input stall.


def test_a_slow_uplink_is_not_an_input_stall() -> None:
    # Before: input_stall 8.8%, ranks 0 and 3, "add DataLoader workers" on +2.6 / +4.3 µs of data time
    # against 29 ms of lateness per step (data 0.12 ms of a 305 ms step on every rank).
    for cluster in (None, CLUSTERS / "lab-20m.yaml"):
        d = diagnose(_run("slow-contig"), cluster=cluster)
        assert "input_stall" not in _modes(d), [(f.mode, f.culprits.ranks) for f in d.findings]
        for f in d.findings:
            assert "data loader" not in f.recommendation
            assert "+0.00 ms" not in f.recommendation and "them start" not in f.recommendation


def test_a_real_data_stall_is_still_an_input_stall(synth) -> None:
    run = synth("a17_stall", ranks=8, steps=100, stall_ranks=(3,), stall_ms=15.0)
    d = diagnose(run)
    f = next(f for f in d.findings if f.mode == "input_stall")
    assert f.culprits.ranks == [3]


# Finding 3: the fabric model prices the run's own rank order.


def test_congested_uplink_keeps_its_foreign_traffic_periods_with_the_cluster_file() -> None:
    # Before: "everywhere, against the fabric model; steps 5–49 (+75.42 ms/step)" — the model priced the
    # packed ring (25.9 ms), so this interleaved run's quiet transfers (47.6 ms) read ×1.85 every step.
    # The foreign streams were on during steps 16–19, 31–36 and 48–49 (lab.json).
    for cluster in (None, CLUSTERS / "lab-200m.yaml"):
        d = diagnose(_run("congested"), cluster=cluster)
        f = next(f for f in d.findings if f.mode == "topology_contention")
        assert "periods" in f.evidence["concentrated"], f.evidence["concentrated"]
        assert "everywhere" not in f.evidence["concentrated"]
        spans = {(p["first_step"], p["last_step"]) for p in f.evidence["periods"]}
        assert (16, 20) in spans and (31, 38) in spans
        assert f.evidence["ring_leaf_crossings"]["crossings"] == 4


def _sim_interleaved(tmp_path: Path, noise: str) -> tuple[Path, object]:
    sc = load_scenario("paper")
    (tmp_path / "noise.yaml").write_text(noise)
    run = sim.simulate(
        sc.cluster, sc.workload, tmp_path / "noise.yaml", nodes=8, steps=120, seed=1,
        out_dir=tmp_path / "run", node_order=[0, 4, 1, 5, 2, 6, 3, 7],
    )
    return run, sc.cluster


def test_an_interleaved_sim_run_is_judged_against_its_own_order(tmp_path) -> None:
    # The simulator's interleaved twin with no fault: the fabric delivers what the model prices for that
    # order, so nothing is "inflated" (before: every transfer read against the packed ring's time).
    run, cluster = _sim_interleaved(tmp_path, "jitter: {cv: 0.01}\n")
    d = diagnose(run, cluster=cluster)
    assert "topology_contention" not in _modes(d)
    assert d.runs[0].metrics["transfer_inflation_median"] < 1.2


# Finding 4: the ring-order check runs without a finding and without a cluster file.


def test_an_interleaved_lab_run_gets_a_rank_order_note_without_a_cluster_file() -> None:
    # Before: "healthy", notes [] — although ranks.parquet puts rank order 0,1,2,3 on nodes 0,2,1,3.
    d = diagnose(_run("slow-inter"))
    m = d.runs[0].metrics
    order = m["ring_leaf_crossings"]
    assert (order["crossings"], order["minimum"], order["nodes"]) == (4, 2, 4)
    note = next(n for n in m["notes"] if n.startswith("rank order"))
    assert "4 times where 2 would do" in note and "fabricpace place" in note and "not priced" in note
    # with the lab's fabric the note prices the order: 514.9 vs 257.5 ms per all-reduce (the lab
    # measured 559 vs 305 ms per step interleaved vs contiguous)
    d = diagnose(_run("slow-inter"), cluster=CLUSTERS / "lab-20m.yaml")
    order = d.runs[0].metrics["ring_leaf_crossings"]
    assert order["model_ms"] == pytest.approx(514.9, abs=1) and order["model_packed_ms"] == pytest.approx(
        257.5, abs=1
    )
    assert 0.3 < order["share_of_step"] < 0.6


def test_a_contiguous_run_gets_no_rank_order_note() -> None:
    for name in ("slow-contig", "healthy"):
        m = diagnose(_run(name)).runs[0].metrics
        assert "ring_leaf_crossings" not in m
        assert not any(n.startswith("rank order") for n in m["notes"])


def test_an_interleaved_sim_run_gets_the_note_too(tmp_path) -> None:
    run, _ = _sim_interleaved(tmp_path, "jitter: {cv: 0.01}\n")
    m = diagnose(run).runs[0].metrics
    assert m["ring_leaf_crossings"]["crossings"] == 8 and m["ring_leaf_crossings"]["minimum"] == 2


# Finding 5 (another engineer): nccl-tests size sweeps are not training runs for the scaling analysis.


def test_size_sweeps_are_left_out_of_scaling(tmp_path, synth) -> None:
    logs = Path(__file__).parents[1] / "fabric" / "data"
    sweeps = [tmp_path / f"n{n}" for n in (2, 4)]
    for n, out in zip((2, 4), sweeps, strict=True):
        log = logs / f"h100ib_n{n}_all_reduce.log"
        res = CliRunner().invoke(app, ["import", "nccl-tests", str(log), "-o", str(out)])
        assert res.exit_code == 0, res.output
    # Before: scaling rows with a mean step over the sizes and efficiency_at_largest 0.67.
    d = diagnose(sweeps)
    assert d.scaling is None
    why = next(a.reason for a in d.abstained if a.mode == "scaling")
    assert why.count(SWEEP_LEFT_OUT) == 2
    # beside training runs of two sizes, the sweeps are left out with their reason and the rows stay
    train = [synth(f"a17_scale_{n}", ranks=n, steps=60) for n in (4, 8)]
    d = diagnose([*sweeps, *train])
    assert d.scaling is not None
    assert [r["world_size"] for r in d.scaling["rows"]] == [4, 8]
    assert d.scaling["left_out"] == {str(p): SWEEP_LEFT_OUT for p in sweeps}


def test_the_note_names_the_lab_runs_own_cluster_and_hosts_files(recorded) -> None:
    # A lab run now writes lab/cluster.yaml and lab/hosts.txt and names them in manifest.cluster: the
    # note's recommendation uses them instead of "--cluster FILE --hosts FILE".
    run = recorded("audit17-lab-slow-inter")
    (run / "lab").mkdir()
    (run / "lab" / "cluster.yaml").write_text((CLUSTERS / "lab-20m.yaml").read_text())
    (run / "lab" / "hosts.txt").write_text(
        "a4-n0 slots=1 leaf=0\na4-n2 slots=1 leaf=1\na4-n1 slots=1 leaf=0\na4-n3 slots=1 leaf=1\n"
    )
    man = json.loads((run / "manifest.json").read_text())
    man["cluster"].update({"file": "lab/cluster.yaml", "hosts": "lab/hosts.txt"})
    (run / "manifest.json").write_text(json.dumps(man))
    note = diagnose(run).runs[0].metrics["ring_leaf_crossings"]["note"]
    cl, hosts = run / "lab" / "cluster.yaml", run / "lab" / "hosts.txt"
    assert f"not priced without --cluster ({cl} describes" in note
    assert f"fabricpace place --cluster {cl} --hosts {hosts}" in note
    assert "fabricpace lab run --placement" in note


def test_the_rank_order_note_is_printed_in_text_mode(recorded) -> None:
    # The note was only in --format json: the text output read "verdict: healthy" with no word.
    # (a copy: the CLI writes diagnosis.json into the run directory)
    run = recorded("audit17-lab-slow-inter")
    r = CliRunner().invoke(app, ["diagnose", str(run)], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "note: rank order" in r.output and "4 times where 2 would do" in r.output.replace("\n", " ")


def test_the_rank_order_note_is_in_the_html_report(tmp_path, recorded) -> None:
    # The report of the interleaved lab run showed "Healthy" and no word of the ring's extra crossings.
    out = tmp_path / "r.html"
    r = CliRunner().invoke(app, ["report", str(recorded("audit17-lab-slow-inter")), "-o", str(out)])
    assert r.exit_code == 0, r.output
    html = out.read_text()
    assert "<b>Notes</b>" in html and "4 times where 2 would do" in html
