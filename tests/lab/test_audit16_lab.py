"""Audit 16 (lab): repeated Ctrl-C during clean-up, tc drift, concurrent studies and local runs, rate
units, scenario checks. Real namespaces, tc, cgroups and gloo ranks; they need root."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fabricpace.lab import fabric, state
from fabricpace.lab._sh import lab_unavailable_reason
from fabricpace.lab.config import LabConfig

REASON = lab_unavailable_reason()
needs_lab = pytest.mark.skipif(REASON is not None, reason=REASON or "")
CLI = [sys.executable, "-m", "fabricpace.cli.app"]


def _uplink_rates(cfg: LabConfig) -> set[int | None]:
    return {fabric.read_rate(cfg.switch_ns, dev) for leaf in range(cfg.leaves)
            for dev in (cfg.uplink_leaf_end(leaf), cfg.uplink_spine_end(leaf))}


def _as_terminal(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    """``cmd`` in its own process group with SIGINT at its default, as a shell's foreground job."""
    with open(log, "wb") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


# ------------------------------------------------------------------------------------------------ 3
@needs_lab
@pytest.mark.lab
def test_ctrl_c_pressed_again_and_again_still_restores_the_uplink(tmp_path, lab_down_after):
    """Audit 16 #3: SIGINT to the run's process group every 30 ms once the uplink was changed (a user
    hammering Ctrl-C) killed the clean-up's own `tc class replace` (same process group): exit -2, the
    uplinks stayed at 20mbit and `.RUN.lab` stayed. Now: exit 130, 200mbit again, nothing left."""
    prefix = "f16i-"
    lab_down_after.append(prefix)
    scen = tmp_path / "change.yaml"
    scen.write_text("name: hammer\nworld: 2\nsteps: 400\nfabric: {leaves: 2, uplink: 200mbit, "
                    "node_link: 1gbit}\nworkload: {batch_per_rank: 16, device_ms_per_sample: 1.0, "
                    "hidden: 64, "
                    "layers: 2}\nfaults:\n  uplink_change: {after_s: 1, rate: 20mbit}\n")
    out = tmp_path / "runs" / "hammer"
    proc = _as_terminal([*CLI, "lab", "run", "--scenario", str(scen), "--out", str(out), "--prefix", prefix],
                        tmp_path / "run.log")
    cfg = LabConfig(nodes=2, leaves=2, prefix=prefix)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if state.read(prefix) and fabric.list_namespaces(prefix) and _uplink_rates(cfg) == {20_000_000}:
                break
            time.sleep(0.2)
        assert proc.poll() is None, (tmp_path / "run.log").read_text()[-2000:]
        assert _uplink_rates(cfg) == {20_000_000}
        sent = 0
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:  # the run ended between poll() and killpg()
                break
            sent += 1
            time.sleep(0.03)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = (tmp_path / "run.log").read_text()
    assert sent >= 5, log
    assert rc == 130, (rc, log[-2000:])
    assert _uplink_rates(cfg) == {200_000_000}, log[-2000:]
    assert not out.exists() and not (out.parent / ".hammer.lab").exists()



def _cli_json(*args: str) -> dict:
    r = subprocess.run([*CLI, *args, "--format", "json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# ------------------------------------------------------------------------------------------------ 2
@needs_lab
@pytest.mark.lab
def test_drifted_shaping_is_listed_repaired_and_measured_as_it_is(lab_down_after):
    """Audit 16 #2: an uplink left at a killed run's 20mbit (or set to 10mbit by hand) and a node link
    whose qdisc was deleted: `lab status` listed no problem, `lab up` said "already up" and `lab
    measure` printed the config's rate as "set". Now status lists each, up re-shapes, measure reads tc."""
    prefix = "f16d-"
    lab_down_after.append(prefix)
    shape = ["--nodes", "2", "--leaves", "2", "--uplink", "200mbit", "--node-link", "1gbit",
             "--prefix", prefix]
    assert _cli_json("lab", "up", *shape)["action"] == "created"
    cfg = fabric.load(prefix)
    fabric.set_uplink_rate(cfg, 20_000_000)  # what a kill -9'd uplink_change run leaves
    subprocess.run(["tc", "-n", cfg.switch_ns, "class", "replace", "dev", cfg.uplink_leaf_end(0), "parent",
                    "1:", "classid", "1:10", "htb", "rate", "10mbit"], check=True)
    subprocess.run(["tc", "-n", cfg.node_ns(0), "qdisc", "del", "dev", "eth0", "root"], check=True)

    m = _cli_json("lab", "measure", "--seconds", "1", "--prefix", prefix)
    assert m["set_rate_bps"] == 10_000_000, m  # the rate tc has on the path, not the config's 200mbit

    st = _cli_json("lab", "status", "--prefix", prefix)
    text = " | ".join(st["problems"])
    assert f"uplink {cfg.uplink_leaf_end(0)} shaped at 10mbit, not 200mbit" in text, text
    assert f"uplink {cfg.uplink_spine_end(1)} shaped at 20mbit, not 200mbit" in text, text
    assert f"node link eth0 in {cfg.node_ns(0)} not shaped" in text, text
    assert len(st["problems"]) == 5  # 4 uplink ends + the node link's deleted qdisc

    again = _cli_json("lab", "up", *shape)
    assert again["action"] == "re-shaped" and len(again["repaired"]) == 5, again
    assert _uplink_rates(cfg) == {200_000_000}
    assert fabric.read_rate(cfg.node_ns(0), "eth0") == 1_000_000_000
    st = _cli_json("lab", "status", "--prefix", prefix)
    assert st["up"] and st["problems"] == [], st
    assert _cli_json("lab", "up", *shape)["action"] == "already up"


@needs_lab
@pytest.mark.lab
def test_a_running_runs_uplink_change_is_not_a_problem_and_not_undone(tmp_path, lab_down_after):
    """While a lab run holds the lab, its uplink change is expected: status does not flag it and `lab
    up` does not re-shape under it (refused: the lab is in use)."""
    prefix = "f16r-"
    lab_down_after.append(prefix)
    cfg = LabConfig(nodes=2, leaves=2, uplink_bps=200_000_000, prefix=prefix)  # as `lab up` makes it
    fabric.up(cfg)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom fabricpace.lab import state\n"
                               "with state.run_claim(sys.argv[1]):\n    print('held', flush=True)\n"
                               "    time.sleep(60)\n", prefix], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        fabric.set_uplink_rate(cfg, 20_000_000)
        st = fabric.status(prefix)
        assert st["problems"] == [] and set(st["uplink_rates"].values()) == {"20mbit"}, st
        r = subprocess.run([*CLI, "lab", "up", "--nodes", "2", "--leaves", "2", "--uplink", "200mbit",
                            "--prefix", prefix], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "already up" in r.stdout, (r.stdout, r.stderr)
    finally:
        holder.kill()
        holder.wait()
    assert _uplink_rates(cfg) == {20_000_000}
    # The run is gone (killed): now the 20mbit is drift, and up repairs it.
    assert len(fabric.status(prefix)["problems"]) == 4
    r = subprocess.run([*CLI, "lab", "up", "--nodes", "2", "--leaves", "2", "--uplink", "200mbit",
                        "--prefix", prefix], capture_output=True, text=True, timeout=60)
    # the table output says what it repaired (before, only --format json listed it)
    assert r.returncode == 0 and "re-shaped" in r.stdout, (r.stdout, r.stderr)
    assert r.stdout.count("repaired: uplink") == 4 and "shaped at 20mbit, not 200mbit" in r.stdout, r.stdout
    assert _uplink_rates(cfg) == {200_000_000}


# ------------------------------------------------------------------------------------------------ 1
def _study_prefixes(study: Path) -> list[str]:
    return [json.loads(p.read_text())["topology"]["fabric"]["prefix"]
            for p in sorted(study.glob("runs/*/lab/lab.json"))]


@needs_lab
@pytest.mark.lab
def test_two_lab_studies_at_once_both_finish(tmp_path):
    """Audit 16 #1: a second `study --backend lab` was refused (both used prefix fps-) and its
    `finally: lab down fps-` ended the first study's ranks (rank 0 exited with -15) and deleted its
    namespaces. Now each point draws a free prefix of its own, and only the run that held a lab takes
    it down: both studies finish (2 ranks each) and leave nothing behind."""
    args = ["study", "--backend", "lab", "--nodes", "2", "--repeats", "1", "--steps", "30", "--warmup", "5",
            "--no-figures"]
    log_a = tmp_path / "a.log"
    with open(log_a, "wb") as fh:
        a = subprocess.Popen([*CLI, *args, "--out", str(tmp_path / "A")], stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and a.poll() is None:  # until A's ranks train
            if list(tmp_path.glob("A/runs/*/ranks.parquet")):
                break
            time.sleep(0.3)
        assert a.poll() is None, log_a.read_text()[-2000:]
        b = subprocess.run([*CLI, *args, "--out", str(tmp_path / "B")], capture_output=True, text=True,
                           timeout=400)
        rc_a = a.wait(timeout=400)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    assert b.returncode == 0, b.stderr[-2000:]
    assert rc_a == 0, log_a.read_text()[-2000:]
    pa, pb = _study_prefixes(tmp_path / "A"), _study_prefixes(tmp_path / "B")
    assert len(pa) == len(pb) == 1 and pa != pb, (pa, pb)
    for prefix in pa + pb:
        assert prefix.startswith("fs") and fabric.leftovers(prefix) == [], prefix
        assert not (state.state_dir() / f"run-{prefix.rstrip('-')}.lock").exists()


@needs_lab
@pytest.mark.lab
def test_a_refused_run_takes_down_nothing(tmp_path, lab_down_after):
    """The refusal itself: a run (down_after, as a study point) on a lab another process holds is
    refused with exit-2's error, and that lab stays up."""
    from fabricpace.lab import launcher
    from fabricpace.lab.scenario import load_scenario

    prefix = "f16b-"
    lab_down_after.append(prefix)
    fabric.up(LabConfig(nodes=2, leaves=2, prefix=prefix))
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom fabricpace.lab import state\n"
                               "with state.run_claim(sys.argv[1]):\n    print('held', flush=True)\n"
                               "    time.sleep(60)\n", prefix], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(launcher.LabBusy, match="in use by another lab run"):
            launcher.run_scenario(load_scenario("healthy"), out=tmp_path / "r", nodes=2, backend="lab",
                                  prefix=prefix, down_after=True)
        assert fabric.status(prefix)["up"]
        assert not (tmp_path / "r").exists()
    finally:
        holder.kill()
        holder.wait()


# ------------------------------------------------------------------------------------------------ 4
def _run_dir_of(pid: str) -> str | None:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return args[args.index(b"--run-dir") + 1].decode() if b"--run-dir" in args else None


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists(),
                    reason="a local run throttles with a cgroup only as root with cgroup v1 cpu")
@pytest.mark.lab
def test_concurrent_local_runs_do_not_share_a_throttle_cgroup(tmp_path):
    """Audit 16 #4: two `lab run --backend local` runs throttling rank 1 both put it into
    /sys/fs/cgroup/cpu/fpl-lab/rank1: 0.05 CPUs shared by both ranks. Now each run's cgroup is its own."""
    scen = tmp_path / "local2.yaml"
    scen.write_text("name: local2\nworld: 2\nsteps: 60\nworkload: {batch_per_rank: 32, "
                    "device_ms_per_sample: 1.0, hidden: 64, layers: 2}\n"
                    "faults:\n  throttle: {ranks: [1], cpus: 0.2}\n")
    outs = [tmp_path / "locA", tmp_path / "locB"]
    procs = [subprocess.Popen([*CLI, "lab", "run", "--backend", "local", "--scenario", str(scen),
                               "--out", str(o)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for o in outs]
    root = Path("/sys/fs/cgroup/cpu/fpl-lab")
    mixed: list[dict[str, list[str]]] = []
    seen: dict[str, set[str]] = {}  # run dir -> cgroups its ranks were in
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            for cg in (root.iterdir() if root.is_dir() else []):
                try:
                    pids = (cg / "cgroup.procs").read_text().split()
                except OSError:
                    continue
                runs = {d for d in map(_run_dir_of, pids) if d in {str(o) for o in outs}}
                for d in runs:
                    seen.setdefault(d, set()).add(cg.name)
                if len(runs) > 1:
                    mixed.append({cg.name: sorted(runs)})
            time.sleep(0.2)
        results = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], [err[-1000:] for _out, err in results]
    assert not mixed, mixed  # before: {'rank1': [locA, locB]}
    assert set(seen) == {str(o) for o in outs}, seen
    assert not seen[str(outs[0])] & seen[str(outs[1])], seen
    for o in outs:
        lab = json.loads((o / "lab" / "lab.json").read_text())
        assert list(lab["throttled_time_ns"]) == ["rank1"], lab["throttled_time_ns"]
    for names in seen.values():  # removed by name at the end of each run
        assert not [n for n in names if (root / n).exists()], names


# ------------------------------------------------------------------------------------------------ 7, 8
@pytest.mark.parametrize(("body", "needles"), [
    # 7: 100mbps built 800mbit uplinks without a word (tc's bps is bytes/s)
    ("world: 4\nfabric: {uplink: 100mbps}\n", ["fabric.uplink", "100mbit for 100 Mbit/s", "800mbit"]),
    ("world: 4\nfaults:\n  uplink_change: {after_s: 1, rate: 2gbps}\n", ["faults.uplink_change.rate"]),
    # 8: leaves 8 with world 4 ran on 4 leaves; [1, 1] gave two throttle events for rank 1
    ("world: 4\nfabric: {leaves: 8}\n", ["fabric.leaves", "4 or fewer"]),
    ("world: 4\nfaults:\n  throttle: {ranks: [1, 1], cpus: 0.05}\n",
     ["faults.throttle.ranks", "rank 1 is listed twice"]),
    ("world: 4\nfaults:\n  gc_noise: {ranks: [2, 0, 2]}\n",
     ["faults.gc_noise.ranks", "rank 2 is listed twice"]),
])
def test_scenario_byte_rates_extra_leaves_and_repeated_ranks_are_refused(cli, refused, tmp_path, body,
                                                                         needles):
    scen = tmp_path / "s.yaml"
    scen.write_text("name: x\n" + body)
    r = cli("lab", "run", "--scenario", str(scen), "--out", str(tmp_path / "r"))
    refused(r, str(scen), *needles)
    assert not (tmp_path / "r").exists()


def test_byte_rate_option_is_refused_with_both_readings(cli, refused):
    r = cli("lab", "up", "--uplink", "100mbps", "--prefix", "f16z-")
    refused(r, "--uplink '100mbps'", "100mbit for 100 Mbit/s", "800mbit for 100 MB/s")


# ------------------------------------------------------------------------------------------------ 9
def test_readme_says_what_to_do_without_sudo():
    """Audit 16 #9: `sudo "$(command -v fabricpace)" lab run ...` gave `sudo: command not found` in a
    root shell without sudo; the README now says to drop it there."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    lab_run = next(line for line in readme.splitlines() if line.startswith("sudo ") and " lab run " in line)
    assert "as root, drop sudo" in lab_run
    assert "in a root shell" in readme and "sudo: command not found" in readme


# ------------------------------------------------------------------------------------------------ 10
@needs_lab
@pytest.mark.lab
def test_a_killed_lab_runs_directory_counts_its_nodes(tmp_path, lab_down_after):
    """Audit 16 #10: after `kill -9` of the launcher (no annotation at the end) the run directory said
    "4 ranks / 1 node": every namespace shared the host's name, which the observer counts. Each rank
    now has its node's name (a UTS namespace of its own), so the observer's own files are right."""
    import polars as pl

    prefix = "f16k-"
    lab_down_after.append(prefix)
    out = tmp_path / "k9"
    proc = subprocess.Popen([*CLI, "lab", "run", "--scenario", "healthy", "--nodes", "2", "--steps", "400",
                             "--out", str(out), "--prefix", prefix], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "manifest.json").is_file() and (out / "ranks.parquet").is_file():
                break
            time.sleep(0.3)
        assert proc.poll() is None
        time.sleep(1.0)
    finally:
        proc.kill()  # kill -9 of the launcher alone; its ranks run on
        proc.wait()
    fabric.down(prefix)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["nodes"] == 2 and manifest["world_size"] == 2, manifest
    hosts = pl.read_parquet(out / "ranks.parquet").sort("rank")["host"].to_list()
    assert hosts == [f"{prefix}n0", f"{prefix}n1"], hosts


@needs_lab
@pytest.mark.lab
def test_a_study_points_lab_down_that_fails_warns_and_does_not_raise(lab_down_after, capfd):
    """(review of audit 16, M2) The lab a study point built is taken down after its run; a teardown
    that cannot finish (here: a cgroup still holding a process the lab never recorded) raised a
    LabError that replaced the run's own result or error. Now one warning names the command."""
    from fabricpace.lab import cgroup, launcher

    if not cgroup.available():
        pytest.skip("cgroup v1 cpu controller not available")
    prefix = "f16w-"
    lab_down_after.append(prefix)
    path = cgroup.cgroup_root(prefix) / "stray"
    path.mkdir(parents=True)
    state.record_cgroup(prefix, str(path.parent))
    state.record_cgroup(prefix, str(path))
    stray = subprocess.Popen(["sleep", "60"])
    try:
        (path / "cgroup.procs").write_text(str(stray.pid))
        launcher._down_after(prefix)  # before: LabError "lab down could not remove ..."
        err = capfd.readouterr().err
        assert f"lab {prefix} was not fully taken down" in err and f"lab down --prefix {prefix}" in err, err
    finally:
        stray.kill()
        stray.wait()
