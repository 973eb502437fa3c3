"""Mode right and culprit right on runs of the simulator (fabricpace.sim, engineer B's engine):
faults injected through its noise files, diagnosed from the run directory it writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricpace import sim
from fabricpace.diagnose import diagnose

SMALL = """name: toy
parameters: 5.0e7
layers: 24
grad_bytes: 4
batch_per_gpu: 32
compute: {seconds: 0.1}
optimizer_seconds: 0.003
"""
# 4 GB of gradients: 160 buckets whose transfers no longer hide behind 100 ms of compute when slowed.
BIG = SMALL.replace("5.0e7", "1.0e9")
# 12 GB of gradients: communication already exposed when quiet, so a 30% slower link shows in full.
HUGE = SMALL.replace("5.0e7", "3.0e9")
DATA = SMALL + "data_seconds: 0.03\n"
NIC0 = ", ".join(f"node0.nic{i}->switch" for i in range(8))
NIC1 = ", ".join(f"{{link: node1.nic{i}->switch, scale: 0.25}}" for i in range(8))

CASES = {
    # name: (workload, noise yaml, cluster for diagnosis, expected modes, expected culprits)
    "healthy": (SMALL, "jitter: {cv: 0.01}", None, [], {}),
    "straggler": (
        SMALL,
        "jitter: {cv: 0.01}\nslow: [{rank: 5, factor: 1.15}]",
        None,
        ["persistent_straggler"],
        {"ranks": [5], "nodes": [0]},
    ),
    "slow_node": (
        SMALL,
        "jitter: {cv: 0.01}\nslow: [{node: 2, factor: 1.12}]",
        None,
        ["persistent_straggler"],
        {"ranks": list(range(16, 24)), "nodes": [2]},
    ),
    "gc": (
        SMALL,
        "jitter: {cv: 0.01}\ngc: {garbage_mb_per_step: 50, threshold_mb: 500, pause_ms_base: 5, "
        "pause_ms_per_mb: 0.06}",
        None,
        ["sync_amplification"],
        {"ranks": []},
    ),
    "input": (DATA, "jitter: {cv: 0.01}", None, ["input_stall"], {"ranks": list(range(32))}),
    "foreign": (
        BIG,
        f"jitter: {{cv: 0.01}}\nforeign: [{{links: [{NIC0}], scale: 0.2, from_step: 60, to_step: 110}}]",
        None,
        ["topology_contention"],
        {},
    ),
    # A tenant taking 30% of the NICs (1/0.7 = 1.43x transfer inflation) for 50 steps: as in the paper
    # scenario's tenant bursts, which the 1.5x threshold of sessions 1-3 did not see.
    "foreign_mild": (
        HUGE,
        f"jitter: {{cv: 0.01}}\nforeign: [{{links: [{NIC0}], scale: 0.7, from_step: 60, to_step: 110}}]",
        None,
        ["topology_contention"],
        {},
    ),
    "slow_links_vs_model": (
        BIG,
        f"jitter: {{cv: 0.01}}\nlinks: [{NIC1}]",
        "single-switch",
        ["topology_contention"],
        {},
    ),
    "healthy_vs_model": (BIG, "jitter: {cv: 0.01}", "single-switch", [], {}),
}


def _simulate(tmp: Path, name: str) -> Path:
    workload, noise, *_ = CASES[name]
    (tmp / "w.yaml").write_text(workload)
    (tmp / "n.yaml").write_text(noise)
    return sim.simulate(
        "single-switch", tmp / "w.yaml", tmp / "n.yaml", nodes=4, steps=130, seed=1, out_dir=tmp / "run"
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_sim_mode_and_culprit(tmp_path, name):
    run = _simulate(tmp_path, name)
    _, _, cluster, modes, culprits = CASES[name]
    d = diagnose([run], cluster=cluster)
    assert [f.mode for f in d.findings] == modes, [f.to_dict() for f in d.findings]
    if not modes:
        assert d.healthy
        return
    f = d.findings[0]
    for key, want in culprits.items():
        assert getattr(f.culprits, key) == want, (name, key, f.culprits)
    if name in ("foreign", "foreign_mild"):  # the tenant sent during steps 60-110: the period is named
        p = f.evidence["periods"][0]
        assert 55 <= p["first_step"] <= 65 and 100 <= p["last_step"] <= 112
