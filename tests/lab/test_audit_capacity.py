"""More ranks than the machine's memory holds are refused before anything starts.

Measured: one lab rank holds 390 MB resident (healthy) to 450 MB (gc-noise's heap); ``--nodes`` takes up
to 64, i.e. ~29 GB, on a development machine with 22 GB available. Before, the ranks were simply
started and the OOM killer would choose among them and everything else on the machine.
"""

from __future__ import annotations

import pytest

from fabricpace._errors import InputError
from fabricpace.lab import launcher
from fabricpace.lab.scenario import load_scenario


def test_too_many_ranks_for_the_memory_are_refused_before_anything(monkeypatch, tmp_path):
    monkeypatch.setenv("FABRICPACE_LAB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(launcher, "mem_available_bytes", lambda: 4 * 2**30)

    def started(*args, **kwargs):
        raise AssertionError("ranks were started")

    monkeypatch.setattr(launcher, "_spawn_workers", started)
    out = tmp_path / "run"
    refusal = r"--nodes 16: 16 ranks need about 7\.0 GiB .* use --nodes 9 or fewer"
    with pytest.raises(InputError, match=refusal):
        launcher.run_scenario(load_scenario("healthy"), out=out, nodes=16, backend="local")
    assert list(tmp_path.iterdir()) == []  # nothing written, no state


def test_ranks_that_fit_are_not_refused():
    launcher.check_memory(4)  # 1.8 GiB: fits on any machine these tests run on
