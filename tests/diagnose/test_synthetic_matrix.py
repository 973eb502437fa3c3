"""Mode right and culprit right, for every failure mode and for healthy runs, on synthetic run
directories whose faults are known exactly (fabricpace.diagnose.synthetic)."""

from __future__ import annotations

import pytest

from fabricpace.diagnose import diagnose

BASE = dict(ranks=16, gpus_per_node=4, nodes_per_leaf=2, steps=140)

CASES = {
    # name: (spec, expected mode, expected culprit check)
    "straggler_rank": (
        dict(slow_ranks=(5,), slow_factor=1.15),
        "persistent_straggler",
        {"ranks": [5], "nodes": [1]},
    ),
    "slow_node": (
        dict(slow_ranks=(8, 9, 10, 11), slow_factor=1.10),
        "persistent_straggler",
        {"ranks": [8, 9, 10, 11], "nodes": [2]},
    ),
    "gc_noise": (dict(gc_prob=0.1, gc_ms=30), "sync_amplification", {"ranks": []}),
    "stall_rank": (dict(stall_ranks=(3,), stall_ms=15), "input_stall", {"ranks": [3]}),
    "stall_fleet": (dict(data_ms=20), "input_stall", {"ranks": list(range(16))}),
    "foreign_period": (dict(foreign=(60, 100, 4.0)), "topology_contention", {"ranks": []}),
    "cross_leaf": (dict(pair_groups=True, cross_leaf_factor=4.0, ranks=32), "topology_contention", {}),
    "slow_stage": (
        dict(stages=4, slow_stage=2, stage_factor=1.3),
        "stage_imbalance",
        {"stages": [2], "ranks": [8, 9, 10, 11]},
    ),
    "straggler_unaligned_clocks": (
        dict(slow_ranks=(6,), slow_factor=1.15, clock_err_ns=None, clock_skew_ns=5_000_000),
        "persistent_straggler",
        {"ranks": [6]},
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_mode_and_culprit(synth, name):
    spec, mode, culprits = CASES[name]
    run = synth(name, **{**BASE, **spec})
    d = diagnose([run])
    modes = [f.mode for f in d.findings]
    assert modes == [mode], (name, modes, d.to_dict()["runs"][0]["metrics"])
    f = d.findings[0]
    for key, want in culprits.items():
        assert getattr(f.culprits, key) == want, (name, key, f.culprits)
    assert f.severity_pct > 3 and 0 < f.confidence <= 1
    assert f.what_if_saving_pct > 0 and f.recommendation
    assert not d.healthy
    # Prose for people: no Python reprs ("ranks [3]", "{...}", "None") and no "stage(s)"/"wait(s)".
    texts = [f.recommendation, *(a.reason for a in d.abstained), *d.runs[0].warnings]
    for text in texts:
        for raw in ("[", "]", "{", "None", "(s)"):
            assert raw not in text, (raw, text)


def test_recommendations_name_culprits_in_words(synth):
    """U7: "The job waits for ranks [3] in most steps" (a list repr in prose)."""
    one = diagnose([synth("straggler_rank", **{**BASE, **CASES["straggler_rank"][0]})]).findings[0]
    assert one.recommendation.startswith("The job waits for rank 5 (GPU1 on node 1) in most steps")
    node = diagnose([synth("slow_node", **{**BASE, **CASES["slow_node"][0]})]).findings[0]
    assert node.recommendation.startswith("The job waits for node 2 in most steps")
    stage = diagnose([synth("slow_stage", **{**BASE, **CASES["slow_stage"][0]})]).findings[0]
    assert stage.recommendation.startswith("Pipeline stage 2 carries more work than the others: move layers "
                                           "from it to stage")


def test_slow_node_names_the_node_as_shared_locality(synth):
    run = synth("slow_node", **{**BASE, **CASES["slow_node"][0]})
    loc = diagnose([run]).findings[0].evidence["shared_locality"]
    assert loc["attribute"] == "node" and loc["values"] == [2] and loc["precision"] == 1.0


def test_cross_leaf_contention_names_cross_leaf_links(synth):
    run = synth("cross_leaf", **{**BASE, **CASES["cross_leaf"][0]})
    f = diagnose([run]).findings[0]
    assert f.evidence["cross_leaf_excess_share"] >= 0.7
    # 8 nodes, 2 per leaf: node pairs (1,2), (3,4), (5,6), (7,0) cross leaves.
    assert f.culprits.links and all("<->" in x or "spine" in x for x in f.culprits.links)


def test_foreign_period_is_located_in_time(synth):
    run = synth("foreign_period", **{**BASE, **CASES["foreign_period"][0]})
    p = diagnose([run]).findings[0].evidence["periods"][0]
    assert 55 <= p["first_step"] <= 65 and 95 <= p["last_step"] <= 100


def test_gc_noise_is_attributed_to_gc(synth):
    run = synth("gc_noise", **{**BASE, **CASES["gc_noise"][0]})
    ev = diagnose([run]).findings[0].evidence
    assert max(ev["variation_made_of"], key=ev["variation_made_of"].get) == "gc"
    assert ev["distinct_slowest_ranks"] >= 10


HEALTHY = {
    "default": {},
    "two_ranks": dict(ranks=2, gpus_per_node=1),
    "jitter_2pct": dict(jitter=0.02),
    "many_ranks": dict(ranks=64, gpus_per_node=8, steps=80),
    "unaligned_clocks": dict(clock_err_ns=None, clock_skew_ns=5_000_000),
    "pipeline_balanced": dict(stages=4),
    "leafy_pairs": dict(pair_groups=True, ranks=32),
    "seed7": dict(seed=7, transfer_jitter=0.1),
}


@pytest.mark.parametrize("name", sorted(HEALTHY))
def test_healthy_runs_are_healthy(synth, name):
    d = diagnose([synth(f"healthy_{name}", **{**BASE, **HEALTHY[name]})])
    assert d.findings == [], [f.to_dict() for f in d.findings]
    assert d.abstained == []
    assert d.healthy and d.runs[0].verdict == "healthy"


def test_straggler_and_noise_together_are_both_named(synth):
    run = synth("mixed", **{**BASE, "slow_ranks": (3,), "slow_factor": 1.2, "gc_prob": 0.1, "gc_ms": 30})
    d = diagnose([run])
    by_mode = {f.mode: f for f in d.findings}
    assert set(by_mode) == {"persistent_straggler", "sync_amplification"}
    assert by_mode["persistent_straggler"].culprits.ranks == [3]


def test_intermittent_straggler_is_named_with_its_cause(synth):
    # Rank 7 alone pauses for GC in 40% of steps: not slower in most steps, but the one everybody
    # waits for far more often than 1/N.
    run = synth("intermittent", **{**BASE, "gc_ranks": (7,), "gc_prob": 0.4, "gc_ms": 20})
    d = diagnose([run])
    assert [f.mode for f in d.findings] == ["persistent_straggler"]
    f = d.findings[0]
    assert f.culprits.ranks == [7] and f.evidence["cause"].startswith("longer GC pauses (a slower CPU there")
