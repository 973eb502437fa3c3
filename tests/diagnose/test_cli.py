"""`fabricpace diagnose` through the real entry point: output formats, diagnosis.json, bad input."""

from __future__ import annotations

import json

from fabricpace.diagnose.synthetic import SynthSpec, write_synthetic


def test_json_on_stdout_and_diagnosis_json_written(cli, tmp_path):
    run = write_synthetic(tmp_path / "slow", SynthSpec(ranks=8, steps=80, slow_ranks=(3,), slow_factor=1.2))
    ok = write_synthetic(tmp_path / "ok", SynthSpec(ranks=8, steps=80, seed=1))
    r = cli("diagnose", str(run), str(ok), "--format", "json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)  # stdout is JSON and nothing else
    assert set(d) >= {"runs", "healthy", "findings", "abstained", "scaling"}
    assert d["healthy"] is False
    assert [x["verdict"] for x in d["runs"]] == ["persistent_straggler", "healthy"]
    assert {x["run"] for x in d["findings"]} == {str(run)}
    assert json.loads((ok / "diagnosis.json").read_text())["healthy"] is True
    f = d["findings"][0]
    assert f["mode"] == "persistent_straggler" and f["culprits"]["ranks"] == [3]
    assert set(f) >= {
        "mode",
        "severity_pct",
        "confidence",
        "culprits",
        "evidence",
        "what_if_saving_pct",
        "recommendation",
    }
    assert set(f["culprits"]) == {"ranks", "nodes", "links", "stages"}
    written = json.loads((run / "diagnosis.json").read_text())
    assert written["findings"] == d["findings"]
    assert not list(run.glob(".diagnosis.json.*"))  # no temp file left behind


def test_text_table_and_scaling(cli, tmp_path):
    runs = [
        write_synthetic(tmp_path / f"n{n}", SynthSpec(ranks=n, steps=60, gc_prob=0.1, gc_ms=25))
        for n in (4, 16)
    ]
    r = cli("diagnose", *map(str, runs))
    assert r.returncode == 0, r.stderr
    assert "sync_amplification" in r.stdout and "Scaling" in r.stdout and "efficiency" in r.stdout
    for run in runs:
        assert json.loads((run / "diagnosis.json").read_text())["scaling"]["rows"]


def _one_line_exit_2(r):
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stdout == ""


def test_bad_input_is_one_line_exit_2_and_nothing_is_written(cli, tmp_path):
    good = write_synthetic(tmp_path / "good", SynthSpec(ranks=4, steps=40))
    empty = tmp_path / "empty"
    empty.mkdir()
    # One good run and one directory that is not a run: the error comes before anything is written.
    _one_line_exit_2(cli("diagnose", str(good), str(empty)))
    assert list(empty.iterdir()) == []
    assert not (good / "diagnosis.json").exists()
    _one_line_exit_2(cli("diagnose", str(good), "--format", "xml"))
    assert not (good / "diagnosis.json").exists()
