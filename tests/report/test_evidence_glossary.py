"""The report's glossary covers the evidence keys the diagnosis added in audit 16: ``cause_by_rank``,
``downstream_ranks``, ``whatif_exposed_transfer_steps`` and ``whatif_before_exposed_transfer_pct`` (and
the what-if bound keys beside them), and the run metric ``size_sweep``. Before, they were shown under
the words of their keys ("whatif before exposed transfer") with no definition, so the report's
tooltip and term list said nothing about them."""

from __future__ import annotations

import html

from fabricpace.diagnose import diagnose
from fabricpace.diagnose.synthetic import SynthSpec, write_synthetic
from fabricpace.report.evidence import GLOSSARY, definition, described
from fabricpace.report.html import findings_html

NEW = ("cause_by_rank", "downstream_ranks", "whatif_exposed_transfer_steps",
       "whatif_before_exposed_transfer_pct", "whatif_bounded_steps", "whatif_from_lateness_pct", "size_sweep")


def test_new_keys_have_a_label_and_a_definition() -> None:
    for key in NEW:
        assert key in GLOSSARY, key
        lab, text = GLOSSARY[key]
        assert lab and "_" not in lab and "whatif" not in lab, (key, lab)
        assert text and len(text) > 40, key


def test_straggler_evidence_reads_with_definitions() -> None:
    """Evidence shaped as persistent_straggler writes it (a pipeline run with a downstream rank, a
    straggler whose what-if the transfer queue cut)."""
    ev = {
        "cause": "slower own compute",
        "downstream_ranks": {"2": {"waits_on_rank": 6, "p2p_wait_excess_ms": 19.87, "explains_share": 0.97}},
        "whatif_bounded_steps": 3,
        "whatif_from_lateness_pct": 10.4,
        "whatif_exposed_transfer_steps": 118,
        "whatif_before_exposed_transfer_pct": 10.1,
    }
    got = {lab: (val, d) for lab, val, d in described(ev)}
    assert got["ranks late only through the pipeline"][0] == (
        "2 waits on rank 6, p2p wait excess 19.87 ms, explains share 97.0%"
    )
    assert got["steps whose transfers would be exposed"][0] == "118"
    assert got["saving before the transfer-queue bound"][0] == "10.1%"
    assert got["saving from the lateness alone"][0] == "10.4%"
    assert got["steps the waiting bounded"][0] == "3"
    assert all(d for _v, d in got.values())


def test_cause_by_rank_of_a_real_diagnosis_has_a_tooltip(tmp_path) -> None:
    """Two culprits with different causes (rank 5 computes 15% slower, rank 9 pauses for GC): the
    report's evidence list shows "cause per rank" with its definition as the tooltip."""
    run = write_synthetic(
        tmp_path / "mixed",
        SynthSpec(steps=120, slow_ranks=(5,), slow_factor=1.15, gc_ranks=(9,), gc_prob=0.6, gc_ms=20),
    )
    d = diagnose([run]).to_dict()
    f = next(f for f in d["findings"] if f["mode"] == "persistent_straggler")
    assert set(f["evidence"]["cause_by_rank"]) == {"5", "9"}
    page = html.unescape(findings_html(d, None))
    assert f'<li title="{definition("cause_by_rank")}">cause per rank: 5 slower own compute' in page
