"""The lab fabric: up/status/down through the real CLI, crash cleanup, and a shaped uplink measured."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fabricpace.lab import fabric, state, traffic
from fabricpace.lab._sh import lab_unavailable_reason
from fabricpace.lab.config import LabConfig
from fabricpace.lab.fabric import leftovers

REASON = lab_unavailable_reason()
pytestmark = [pytest.mark.lab, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def test_up_status_down_leaves_nothing(cli, lab_down_after):
    prefix = "fpu-"
    lab_down_after.append(prefix)
    r = cli("lab", "up", "--nodes", "4", "--leaves", "2", "--uplink", "100mbit", "--prefix", prefix,
            "--format", "json")
    assert r.returncode == 0, r.stderr
    up = json.loads(r.stdout)
    assert up["action"] == "created" and up["up"]
    assert sorted(up["namespaces"]) == sorted([f"{prefix}n{i}" for i in range(4)] + [f"{prefix}sw",
                                              f"{prefix}x0", f"{prefix}x1"])
    assert up["config"]["node_leaf"] == [0, 0, 1, 1]
    assert set(up["uplink_rates"].values()) == {"100mbit"}
    # Idempotent: the same command again changes nothing.
    again = json.loads(cli("lab", "up", "--nodes", "4", "--leaves", "2", "--uplink", "100mbit",
                           "--prefix", prefix, "--format", "json").stdout)
    assert again["action"] == "already up"
    st = json.loads(cli("lab", "status", "--prefix", prefix, "--format", "json").stdout)
    assert st["up"] and not st["problems"]
    r = cli("lab", "down", "--prefix", prefix)
    assert r.returncode == 0, r.stderr
    assert leftovers(prefix) == []
    assert not state.state_path(prefix).exists()
    st = json.loads(cli("lab", "status", "--prefix", prefix, "--format", "json").stdout)
    assert not st["up"] and st["namespaces"] == []
    # Twice is fine.
    assert cli("lab", "down", "--prefix", prefix).returncode == 0


def test_down_after_crash_removes_namespaces_processes_and_cgroups(lab_down_after):
    """A lab whose owner died mid-run: a process still inside a namespace, a throttled cgroup,
    a stray link in the root namespace. `down` finds all of it by prefix and recorded PIDs."""
    prefix = "fpc-"
    lab_down_after.append(prefix)
    cfg = LabConfig(nodes=2, leaves=2, prefix=prefix, foreign_hosts=False)
    fabric.up(cfg)
    sleeper = subprocess.Popen(["ip", "netns", "exec", cfg.node_ns(1), sys.executable, "-c",
                                "import time; time.sleep(120)"])
    state.record_pid(prefix, sleeper.pid, "sleeper")
    from fabricpace.lab import cgroup

    if cgroup.available():
        cg = cgroup.throttle(prefix, "rank1", sleeper.pid, 0.2)
        assert int((cg / "cpu.cfs_quota_us").read_text()) == int(0.2 * cgroup.PERIOD_US)
    subprocess.run(["ip", "link", "add", f"{prefix}stray", "type", "veth", "peer", "name", f"{prefix}strayp"],
                   check=True)
    # "Crash": the state file is now all that remains of the owner.
    r = subprocess.run([sys.executable, "-m", "fabricpace.cli.app", "lab", "down", "--prefix", prefix],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sleeper.wait(timeout=10) != 0  # it was ended, not left running
    assert leftovers(prefix) == []
    assert not cgroup.cgroup_root(prefix).exists()


def test_down_without_state_file_still_finds_prefix(lab_down_after):
    prefix = "fpd-"
    lab_down_after.append(prefix)
    fabric.up(LabConfig(nodes=2, leaves=1, prefix=prefix, foreign_hosts=False))
    state.state_path(prefix).unlink()  # a crash before the state was written, or a lost /run
    fabric.down(prefix)
    assert leftovers(prefix) == []


def test_shaped_uplink_measures_within_20_percent(lab_down_after):
    prefix = "fpm-"
    lab_down_after.append(prefix)
    cfg = LabConfig(nodes=4, leaves=2, uplink_bps=100_000_000, prefix=prefix, foreign_hosts=False)
    fabric.up(cfg)
    m = traffic.measure_uplink(cfg, seconds=2.0)
    assert m.bytes <= cfg.uplink_bps / 8 * 2.0 * 2 + traffic.CHUNK  # bounded in bytes
    assert 0.8 <= m.ratio <= 1.2, f"uplink measured {m.goodput_bps / 1e6:.1f} Mbit/s for 100 Mbit/s"
    # Changing the rate mid-run takes effect (the uplink-change fault).
    fabric.set_uplink_rate(cfg, 30_000_000)
    slow = traffic.measure(cfg, cfg.node_ns(0), cfg.node_ns(3), cfg.node_addr(3), seconds=1.5,
                           set_rate_bps=30_000_000)
    assert 0.8 <= slow.ratio <= 1.2, f"measured {slow.goodput_bps / 1e6:.1f} Mbit/s for 30 Mbit/s"


def test_traffic_refuses_addresses_outside_the_lab():
    r = subprocess.run([sys.executable, "-m", "fabricpace.lab.traffic", "send", "--addr", "8.8.8.8",
                        "--duration", "1"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "outside the lab subnet" in r.stderr


def test_bad_input_is_one_line_exit_2(cli):
    r = cli("lab", "up", "--uplink", "fast")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--uplink" in r.stderr
    r = cli("lab", "up", "--nodes", "4", "--leaves", "9")
    assert r.returncode == 2 and "--leaves" in r.stderr
