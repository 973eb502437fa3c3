"""fabricpace lab commands through the real entry point: user mistakes are one line and exit 2."""

from __future__ import annotations

import pytest

from fabricpace.lab._sh import lab_unavailable_reason

REASON = lab_unavailable_reason()
pytestmark = [pytest.mark.lab, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def test_measure_on_a_one_leaf_lab_says_how_to_get_an_uplink(cli):
    from fabricpace.lab import fabric

    prefix = "fpv-"
    try:
        r = cli("lab", "up", "--nodes", "2", "--leaves", "1", "--prefix", prefix)
        assert r.returncode == 0, r.stderr
        r = cli("lab", "measure", "--prefix", prefix)
        assert r.returncode == 2, r.stderr  # a lab built the wrong shape: bad input, not a crash
        assert len(r.stderr.strip().splitlines()) == 1
        assert "--leaves 2" in r.stderr and "Traceback" not in r.stderr
    finally:
        fabric.down(prefix)
    assert not fabric.leftovers(prefix)


def test_measure_without_a_lab_is_one_line(cli):
    r = cli("lab", "measure", "--prefix", "fpz-")  # a valid prefix no lab uses
    assert r.returncode == 2
    assert "lab up" in r.stderr and len(r.stderr.strip().splitlines()) == 1
