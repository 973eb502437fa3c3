"""Scenario files the validator let through, or refused without naming the file and field.

Before: ``fabric: {uplink: -100mbit}`` was refused as "rate '-100mbit': ..." (no file, no field); a
non-UTF-8 file was a UnicodeDecodeError traceback, exit 1; ``throttle: {cpus: 0.005}`` passed and
failed only when the quota was set, after the ranks had started (cgroup.throttle takes 0.01 to 64);
``throttle: {ranks: []}`` ran a "throttled" scenario with no fault, exit 0; a foreign flow on one leaf
passed and failed after the ranks started; a folder was "no such file".
"""

from __future__ import annotations

import pytest

from fabricpace._errors import ConfigError
from fabricpace.lab.scenario import load_scenario

HEAD = "name: x\nworld: 4\nsteps: 20\n"


@pytest.mark.parametrize(
    ("body", "needles"),
    [
        ("fabric: {uplink: -100mbit}\n", ["field 'fabric.uplink'", "100mbit"]),
        ("fabric: {node_link: 0mbit}\n", ["field 'fabric.node_link'", "10kbit"]),
        ("faults: {uplink_change: {after_s: 1, rate: fast}}\n", ["field 'faults.uplink_change.rate'"]),
        ("faults: {throttle: {ranks: [1], cpus: 0.005}}\n", ["field 'faults.throttle.cpus'", "0.01"]),
        ("faults: {throttle: {ranks: [], cpus: 0.1}}\n", ["field 'faults.throttle.ranks'", "at least 1"]),
        ("faults: {gc_noise: {ranks: []}}\n", ["field 'faults.gc_noise.ranks'", "at least 1"]),
        ("fabric: {leaves: 1}\nfaults: {foreign_flow: {streams: 2}}\n",
         ["field 'faults.foreign_flow'", "fabric.leaves to 2"]),
    ],
)
def test_bad_field_names_file_and_field(tmp_path, body, needles):
    path = tmp_path / "bad.yaml"
    path.write_text(HEAD + body)
    with pytest.raises(ConfigError) as err:
        load_scenario(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg
    for needle in needles:
        assert needle in msg, msg


def test_not_utf8_and_folder_are_one_line_exit_2(cli, refused, tmp_path):
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    out = tmp_path / "run"
    refused(cli("lab", "run", "--scenario", str(binary), "--backend", "local", "--out", str(out)),
            str(binary), "not UTF-8")
    folder = tmp_path / "scenarios.yaml"
    folder.mkdir()
    refused(cli("lab", "run", "--scenario", str(folder), "--backend", "local", "--out", str(out)),
            "is a folder")
    assert not out.exists() and not (tmp_path / ".run.lab").exists()


def test_shipped_scenarios_still_load():
    for name in ("healthy", "gc-noise", "throttled-rank", "congested-uplink"):
        assert load_scenario(name).name == name
