"""`fabricpace diagnose --steps FIRST:LAST`: one window of a long run, read alone, with its own file.

The run: node 1 computes 30% slower from step 150 of 300. The whole run reads as spread-out lateness
(its straggler is the last arriver in only half the steps); the window after the onset names node 1, the
window before it is healthy, and neither window overwrites the whole run's diagnosis.json."""

from __future__ import annotations

import json

import pytest

from fabricpace import sim
from fabricpace.diagnose import DiagnoseConfig, diagnose
from fabricpace.run.reader import StepChunks


@pytest.fixture(scope="module")
def onset_run(tmp_path_factory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("window")
    (tmp / "n.yaml").write_text("jitter: {cv: 0.02}\nslow:\n  - {node: 1, factor: 1.3, from_step: 150}\n")
    return sim.simulate("roce-leaf-spine-2to1", "gpt-1.3b", tmp / "n.yaml", nodes=4, steps=300, seed=1,
                        out_dir=tmp / "run")


def _json(cli, run, *args):  # type: ignore[no-untyped-def]
    r = cli("diagnose", str(run), "--format", "json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["runs"][0]


def test_windows_before_and_after_the_onset(cli, onset_run):  # type: ignore[no-untyped-def]
    before = _json(cli, onset_run, "--steps", "0:149")
    after = _json(cli, onset_run, "--steps", "160:")
    assert before["verdict"] == "healthy"
    # the run's warm-up is its first steps: a window later in the run keeps all of its own
    assert before["metrics"]["step_window"] == [20, 149] and before["steps_used"] == 130
    assert after["metrics"]["step_window"] == [160, 299] and after["steps_used"] == 140
    assert after["verdict"] == "persistent_straggler"
    written = json.loads((onset_run / "diagnosis-steps-160-end.json").read_text())
    assert written["findings"][0]["culprits"]["nodes"] == [1]
    assert (onset_run / "diagnosis-steps-0-149.json").is_file()
    assert not (onset_run / "diagnosis.json").exists()  # the whole run's file is not written by a window


def test_the_window_is_all_that_is_read(onset_run):  # type: ignore[no-untyped-def]
    chunks = StepChunks(onset_run, "collectives", step_range=(200, 209))
    assert chunks.step_span == (200, 209)
    frame = chunks.read(*chunks.step_span)
    assert frame["step"].min() == 200 and frame["step"].max() == 209
    d = diagnose([onset_run], config=DiagnoseConfig(steps=(200, 209)))
    assert d.runs[0].steps_used == 10


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("abc", "--steps 'abc': expected FIRST:LAST step numbers, e.g. --steps 5000:6000"),
        ("9:3", "--steps '9:3': need 0 <= FIRST <= LAST"),
        (":", "--steps ':': expected FIRST:LAST"),
        ("500:600", "holds steps 0..299; choose a window inside them"),
    ],
)
def test_bad_windows_are_one_line_errors(cli, onset_run, arg, message):  # type: ignore[no-untyped-def]
    r = cli("diagnose", str(onset_run), "--steps", arg)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
