"""report.html says what a lab, local or simulated run injected (audit 16, finding 6).

The demo's report named ``persistent_straggler rank 2 ... cause: longer GC pauses`` and never said
what the demo had put into the run (a 0.08-CPU cgroup quota on rank 2, GC churn on every rank): 0
hits for "throttle", "quota", "inject", "scenario" and "demo-local-noisy" in its 5,949 characters of
text. A run whose manifest records its faults now gets a "What this run injected" section, labelled
as the ground truth, next to the findings; a run observed in a real job gets nothing extra.
"""

from __future__ import annotations

import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

from fabricpace.report import injected as inj
from fabricpace.report.html import render_report
from fabricpace.run.manifest import read_manifest, write_manifest

REAL = Path(__file__).parents[1] / "diagnose" / "data" / "real"
GOLDEN = Path(__file__).parent / "data" / "injected_local.golden.html"
# lab/lab.json as `fabricpace demo` (as root) wrote it for its local-off run in the audit.
LAB_JSON = {
    "topology": {"backend": "local", "placement": "contiguous", "rank_node": [0, 1, 2, 3]},
    "events": [
        {"event": "training_started", "after_s": 17.25},
        {"event": "throttle", "rank": 2, "cpus": 0.08, "unix_s": 1796100182.592809},
        {"event": "ranks_done", "after_s": 121.78},
    ],
    "foreign_on_periods_ns": [],
    "throttled_time_ns": {"rank2": 53312588116},
}


class _Text(HTMLParser):
    """The text a reader sees (scripts and styles left out), as the audit read report.html."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: object) -> None:
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag: str) -> None:
        self._skip -= tag in ("script", "style")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def text_of(html: str) -> str:
    p = _Text()
    p.feed(html)
    return " ".join(" ".join(p.parts).split())


def _demo_run(tmp_path: Path, *, lab_json: bool = True) -> Path:
    """The real 4-rank demo run of the diagnosis tests (local backend, scenario demo-local-noisy:
    rank 2 under a 0.08-CPU quota, GC churn on every rank), with its lab.json when asked."""
    run = tmp_path / "local-off"
    shutil.copytree(REAL / "demo-throttled-rank2-load", run)
    if lab_json:
        (run / "lab").mkdir()
        (run / "lab" / "lab.json").write_text(json.dumps(LAB_JSON))
    return run


def test_local_run_report_says_what_was_injected_and_compares(tmp_path: Path) -> None:
    run = _demo_run(tmp_path)
    html = render_report([run])
    assert '<a href="#injected">What was injected</a>' in html
    assert html.index('id="findings"') < html.index('id="injected"') < html.index('id="runs"')
    section = text_of(html[html.index('id="injected"') - 4:html.index('id="runs"') - 4])
    assert section.startswith("What this run injected")
    assert "Ground truth of a local run" in section and "demo-local-noisy" in section
    assert "rank 2 CPU quota 0.08 CPUs (a cgroup CPU quota on the rank's process)" in section
    assert "time the quota held it back: rank 2: 53.3 s" in section
    assert "every rank GC churn: 10,000–30,000 cyclic objects allocated per step (mean 20,000)" in section
    assert "over a live heap of 300,000 objects" in section
    assert "The scenario is meant to show: sync_amplification + persistent_straggler" in section
    # Whatever the diagnosis finds in this run, the section holds it against rank 2's quota.
    assert "Findings against the injection: the diagnosis named" in section
    assert "rank 2, the rank this run slowed (CPU quota 0.08 CPUs)" in section or \
        "named rank 2 — the rank this run slowed (CPU quota 0.08 CPUs)" in section, section


def test_without_lab_json_the_scenario_is_shown_and_the_gap_said(tmp_path: Path) -> None:
    text = text_of(render_report([_demo_run(tmp_path, lab_json=False)], findings=False))
    assert "rank 2 CPU quota 0.08 CPUs" in text
    assert "how it was applied is not recorded (no lab/lab.json)" in text
    assert "lab/lab.json is missing or unreadable" in text
    assert "Findings against the injection" not in text  # --no-findings: nothing to compare


def test_local_run_without_root_names_the_stand_in_and_no_fabric_faults(tmp_path: Path) -> None:
    """Without root the launcher slows the rank with extra compute (no throttle event in lab.json),
    and the local backend has no fabric for a foreign flow or an uplink change."""
    run = _demo_run(tmp_path)
    m = read_manifest(run)
    m.extra["faults"] = m.extra["faults"] | {"foreign_flow": {"streams": 8, "on_s": 1.5, "off_s": 1.5},
                                             "uplink_change": {"after_s": 8.0, "rate": "50mbit"}}
    write_manifest(run, m)
    lab = dict(LAB_JSON, events=[e for e in LAB_JSON["events"] if e["event"] != "throttle"],
               throttled_time_ns={})
    (run / "lab" / "lab.json").write_text(json.dumps(lab))
    text = text_of(render_report([run], findings=False))
    assert "rank 2 extra compute each step (the stand-in for a CPU quota of 0.08 CPUs)" in text
    assert "no cgroup CPU quota (it needs root and cgroup v1)" in text
    assert "foreign bulk TCP traffic: 8 streams, on 1.5 s / off 1.5 s" in text
    assert "rate changed to 50mbit after 8 s" in text
    assert text.count("not applied: the local backend has no fabric (loopback)") == 2


def test_observed_run_shows_nothing_extra(tmp_path: Path) -> None:
    run = tmp_path / "observed"
    shutil.copytree(REAL / "two-slow-ranks-load", run)
    html = render_report([run], findings=False)
    assert 'id="injected"' not in html and "What was injected" not in html and "Ground truth" not in html


def test_simulated_run_lists_its_noise_files_faults(tmp_path: Path, cli) -> None:
    out = tmp_path / "sim"
    r = cli("simulate", "--cluster", "single-switch", "--workload", "resnet-50", "--noise", "slow-node",
            "--nodes", "4", "--steps", "60", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    text = text_of(render_report([out]))
    assert "Ground truth of a simulation, noise slow-node" in text
    assert "node 1 compute ×1.1 (far-NUMA host path)" in text
    assert "every rank compute jitter: CV 0.02" in text
    assert "how it was applied" not in text  # a simulation applies its noise file as written
    # the simulated slow node is persistent and 10%: the diagnosis names it
    assert "Findings against the injection: the diagnosis named node 1 — the node this run slowed " \
           "(compute ×1.1)." in text


def test_compare_line_says_when_the_diagnosis_misses_or_adds_ranks() -> None:
    truth = inj.Injected("local", "x", inj.scenario_faults({"throttle": {"ranks": [2], "cpus": 0.08}},
                                                           backend="local", cgroup=True))

    def f(ranks: list[int], nodes: list[int] | None = None) -> dict[str, object]:
        return {"mode": "persistent_straggler", "culprits": {"ranks": ranks, "nodes": nodes or ranks}}

    quota = "(CPU quota 0.08 CPUs)"
    assert inj.compare_line(truth, [f([2])]) == (
        f"the diagnosis named rank 2 — the rank this run slowed {quota}")
    assert inj.compare_line(truth, [f([1])]) == (
        f"the diagnosis named rank 1, not rank 2, the rank this run slowed {quota}")
    assert inj.compare_line(truth, [f([1, 2])]) == (
        f"the diagnosis named ranks 1 and 2: rank 2, the rank this run slowed {quota}, and rank 1, which "
        "this run did not slow on purpose")
    assert inj.compare_line(truth, []) == (
        f"the diagnosis named no culprit: it did not find rank 2, the rank this run slowed {quota}")
    # findings of another run in the same report do not count
    other = dict(f([2]), run="/elsewhere/run")
    assert inj.compare_line(truth, [other], run_dir=Path("/here/run")).startswith("the diagnosis named no")
    noise_only = inj.Injected("local", "gc",
                              inj.scenario_faults({"gc_noise": {"ranks": "all"}}, backend="local"))
    assert inj.compare_line(noise_only, [f([1])]) is None


def test_injected_section_matches_golden() -> None:
    """The section for the demo's recorded run, with the diagnosis the audit saw (rank 2, cause
    "longer GC pauses"): byte for byte."""
    from fabricpace.report.html import injected_html

    faults = {"gc_noise": {"churn": 20000, "heap": 300000, "lifetime": 3, "ranks": "all"},
              "throttle": {"cpus": 0.08, "ranks": [2]}}
    truth = inj.Injected("local", "demo-local-noisy",
                         inj.scenario_faults(faults, backend="local", lab=LAB_JSON),
                         "sync_amplification + persistent_straggler")
    diag = {"findings": [{"mode": "persistent_straggler", "run": "local-off",
                          "culprits": {"ranks": [2], "nodes": [2]},
                          "evidence": {"cause": "longer GC pauses"}}]}
    html = injected_html([("local-off", Path("local-off"), truth)], diag)
    assert html + "\n" == GOLDEN.read_text()


def test_a_hand_edited_faults_record_is_said_not_a_crash(tmp_path: Path) -> None:
    """(review of audit 16) ``cpus: null`` or ``ranks: ["x"]`` in manifest.extra.faults made
    `fabricpace report` end in a traceback (exit 1); the section now says the record is unreadable."""
    for bad in ({"throttle": {"ranks": [2], "cpus": None}}, {"throttle": {"ranks": ["x"], "cpus": 0.08}}):
        run = _demo_run(tmp_path / str(len(list(tmp_path.iterdir()))))
        m = read_manifest(run)
        m.extra["faults"] = bad
        write_manifest(run, m)
        text = text_of(render_report([run], findings=False))
        assert "manifest.extra.faults could not be read" in text, text[:2000]
