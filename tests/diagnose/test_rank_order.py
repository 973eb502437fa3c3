"""topology_contention names an unsorted rank order: NCCL's rings follow rank order, so a hostfile that
is not grouped by leaf makes the ring cross the spine more often than it has to."""

from __future__ import annotations

from fabricpace import sim
from fabricpace.diagnose import diagnose
from fabricpace.study import load_scenario

# Tenant bursts on every spine uplink of the paper cluster's first two leaves, steps 40-80.
_LINKS = ", ".join(f"leaf{lf}->spine{s}, spine{s}->leaf{lf}" for lf in (0, 1) for s in range(4))
NOISE = f"jitter: {{cv: 0.01}}\nforeign: [{{links: [{_LINKS}], scale: 0.5, from_step: 40, to_step: 80}}]\n"


def _diagnose(tmp_path, name, node_order):  # type: ignore[no-untyped-def]
    sc = load_scenario("paper")
    (tmp_path / "n.yaml").write_text(NOISE)
    run = sim.simulate(
        sc.cluster, sc.workload, tmp_path / "n.yaml", nodes=8, steps=120, seed=1, out_dir=tmp_path / name,
        node_order=node_order,
    )
    d = diagnose([run])
    return next((f for f in d.findings if f.mode == "topology_contention"), None)


def test_an_interleaved_rank_order_is_named_with_its_crossings(tmp_path):
    f = _diagnose(tmp_path, "interleaved", [0, 4, 1, 5, 2, 6, 3, 7])
    assert f is not None
    order = f.evidence["ring_leaf_crossings"]
    assert (order["crossings"], order["minimum"], order["nodes"]) == (8, 2, 8)
    assert "fabricpace place" in f.recommendation and "8 times where 2" in f.recommendation


def test_a_leaf_grouped_order_gets_no_rank_order_note(tmp_path):
    f = _diagnose(tmp_path, "packed", None)
    assert f is not None  # the tenant periods are still found
    assert "ring_leaf_crossings" not in f.evidence
    assert "node order" not in f.recommendation
