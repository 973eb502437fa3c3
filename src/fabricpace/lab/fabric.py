"""Build, inspect and tear down the lab fabric: network namespaces as nodes, bridges as switches.

Layout (prefix ``fp-``, 4 nodes on 2 leaves)::

    fp-n0 eth0 ─ fp-p0 ┐                                   ┌ fp-p2 ─ eth0 fp-n2
    fp-n1 eth0 ─ fp-p1 ┴ fp-leaf0 ─ fp-up0l ═ fp-up0s ─ fp-spine ─ fp-up1s ═ fp-up1l ─ fp-leaf1 ┴ fp-p3 ─ ...
                    (fp-x0: foreign host on leaf 0)                    (fp-x1: foreign host on the last leaf)

All bridges live in one switch namespace (``fp-sw``); every node is its own namespace with one veth
(``eth0``, address 10.77.0.<node+1>/24). Every link is shaped in both directions with an htb class on
the egress of each end (veth egress on one end is the other end's ingress), so the uplinks are the
oversubscribed bottleneck between leaves. ``down`` removes everything found by the prefix and the state
file (processes, cgroups, namespaces, links, the /run/netns mount when the lab made it).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

from fabricpace._errors import InputError, LabError
from fabricpace.lab import _sh, state
from fabricpace.lab.cgroup import cgroup_root
from fabricpace.lab.config import LabConfig, check_prefix, format_rate, parse_rate

NETNS_DIR = Path("/run/netns")
HTB_HANDLE = "1:"
HTB_CLASS = "1:10"


def require_lab() -> None:
    """Raise LabError with a clear reason when the lab cannot run on this machine."""
    reason = _sh.lab_unavailable_reason()
    if reason:
        raise LabError(reason)


def _mount_marker() -> Path:
    state.state_dir().mkdir(parents=True, exist_ok=True)
    return state.state_dir() / "netns-mount-made-by-lab"


def netns_mounted() -> bool:
    """Is /run/netns a mount point? (os.path.ismount misses a bind mount of a directory onto itself.)"""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    return any(line.split()[4] == str(NETNS_DIR) for line in mounts)


def list_namespaces(prefix: str) -> list[str]:
    out = _sh.run(["ip", "netns", "list"]).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(prefix))


def _root_links(prefix: str) -> list[str]:
    out = _sh.run(["ip", "-o", "link", "show"]).stdout
    names = [m.group(1).split("@")[0] for m in re.finditer(r"^\d+: ([^:]+):", out, flags=re.M)]
    return sorted(n for n in names if n.startswith(prefix))


def leftovers(prefix: str) -> list[str]:
    """Everything with the lab's prefix that still exists: namespaces, root links, cgroups, state file."""
    check_prefix(prefix)
    found = list_namespaces(prefix) + _root_links(prefix)
    if cgroup_root(prefix).exists():
        found.append(str(cgroup_root(prefix)))
    if state.state_path(prefix).exists():
        found.append(str(state.state_path(prefix)))
    return found


# ---------------------------------------------------------------------------------------------- shaping
def shape(ns: str, dev: str, bps: int) -> None:
    """Shape ``dev``'s egress to ``bps`` with one htb class (replace: idempotent)."""
    rate = f"{bps}bit"
    qdiscs = _sh.run(["tc", "-n", ns, "qdisc", "show", "dev", dev]).stdout
    if "htb 1: root" not in qdiscs:  # htb cannot be "replaced" by itself; only its class changes
        _sh.run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "handle", HTB_HANDLE, "htb",
                 "default", "10"])
    # An explicit quantum avoids htb's "quantum is big" warning at high rates.
    _sh.run(["tc", "-n", ns, "class", "replace", "dev", dev, "parent", HTB_HANDLE, "classid", HTB_CLASS,
             "htb", "rate", rate, "ceil", rate, "quantum", "60000"])


_TC_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}


def read_rate(ns: str, dev: str) -> int | None:
    """The htb rate (bits/s) currently set on ``dev``'s class, or None when unshaped (no htb qdisc or
    no class 1:10: ``tc qdisc del`` takes the class with it)."""
    out = _sh.run(["tc", "-n", ns, "class", "show", "dev", dev], check=False).stdout
    m = re.search(r"class htb 1:10 .*?rate (\d+(?:\.\d+)?)([A-Za-z]+)", out)
    if not m or m.group(2).lower() not in _TC_UNITS:
        return None
    return round(float(m.group(1)) * _TC_UNITS[m.group(2).lower()])


def _same_rate(have: int, want: int) -> bool:
    """tc prints rates rounded (e.g. 1234Kbit); a drifted link is off by far more than 1%."""
    return abs(have - want) <= max(8, want // 100)


def shaped_links(cfg: LabConfig) -> list[tuple[str, str, int, str]]:
    """Every shaped link end: (namespace, device, rate it should have, what it is)."""
    links: list[tuple[str, str, int, str]] = []
    for leaf in range(cfg.leaves):
        for dev in (cfg.uplink_leaf_end(leaf), cfg.uplink_spine_end(leaf)):
            links.append((cfg.switch_ns, dev, cfg.uplink_bps, "uplink"))
    hosts = [(cfg.node_ns(n), cfg.node_port(n)) for n in range(cfg.nodes)]
    if cfg.foreign_hosts:
        hosts += [(cfg.foreign_ns(side), cfg.foreign_port(side)) for side in (0, 1)]
    for ns, port in hosts:
        links.append((ns, cfg.NODE_IFACE, cfg.node_link_bps, "node link"))
        links.append((cfg.switch_ns, port, cfg.node_link_bps, "node link"))
    return links


def set_uplink_rate(cfg: LabConfig, bps: int) -> None:
    """Change every uplink's rate in both directions (used mid-run by the uplink-change fault)."""
    for leaf in range(cfg.leaves):
        shape(cfg.switch_ns, cfg.uplink_leaf_end(leaf), bps)
        shape(cfg.switch_ns, cfg.uplink_spine_end(leaf), bps)
    with state.locked(cfg.prefix) as st:
        st["shaping"]["uplink"] = format_rate(bps)


# ---------------------------------------------------------------------------------------------- up
def live_processes(prefix: str) -> list[dict[str, Any]]:
    """The processes recorded in the lab's state that still run (same PID and kernel start time)."""
    st = state.read(prefix)
    if st is None:
        return []
    return [p for p in st["pids"] if state.proc_start_time(p["pid"]) == p["start"]]


def refuse_if_busy(prefix: str, doing: str) -> None:
    """InputError when a run still uses the lab: ``doing`` would end its ranks (down ends them all)."""
    busy = live_processes(prefix)
    if not busy and state.claimed_elsewhere(prefix):
        raise InputError(
            f"lab {prefix} is in use by a lab run that is starting; {doing} would end it: wait for it to "
            f"finish, use another --prefix, or stop it with `fabricpace lab down --prefix {prefix}`"
        )
    if busy:
        who = ", ".join(f"{p['what']} PID {p['pid']}" for p in busy[:4]) + (", ..." if len(busy) > 4 else "")
        raise InputError(
            f"lab {prefix} is in use by a running lab run ({who}); {doing} would end it: wait for it to "
            f"finish, use another --prefix, or stop it with `fabricpace lab down --prefix {prefix}`"
        )


def _add_ns(prefix: str, name: str) -> None:
    with state.locked(prefix) as st:
        if name not in st["namespaces"]:
            st["namespaces"].append(name)
    _sh.run(["ip", "netns", "add", name])
    _sh.run(["ip", "-n", name, "link", "set", "lo", "up"])


def _attach_host(cfg: LabConfig, ns: str, port: str, addr: str, leaf: int) -> None:
    """A veth from host namespace ``ns`` (as eth0) to ``port`` on leaf bridge ``leaf``, both ends shaped."""
    sw = cfg.switch_ns
    _sh.run(["ip", "link", "add", cfg.NODE_IFACE, "netns", ns, "type", "veth", "peer", "name", port,
             "netns", sw])
    _sh.run(["ip", "-n", sw, "link", "set", port, "master", cfg.leaf_bridge(leaf)])
    _sh.run(["ip", "-n", sw, "link", "set", port, "up"])
    _sh.run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", cfg.NODE_IFACE])
    _sh.run(["ip", "-n", ns, "link", "set", cfg.NODE_IFACE, "up"])
    shape(ns, cfg.NODE_IFACE, cfg.node_link_bps)  # node -> leaf
    shape(sw, port, cfg.node_link_bps)  # leaf -> node


def _build(cfg: LabConfig) -> None:
    sw = cfg.switch_ns
    _add_ns(cfg.prefix, sw)
    _sh.run(["ip", "-n", sw, "link", "add", cfg.spine_bridge, "type", "bridge"])
    _sh.run(["ip", "-n", sw, "link", "set", cfg.spine_bridge, "up"])
    for leaf in range(cfg.leaves):
        br = cfg.leaf_bridge(leaf)
        _sh.run(["ip", "-n", sw, "link", "add", br, "type", "bridge"])
        _sh.run(["ip", "-n", sw, "link", "set", br, "up"])
        a, b = cfg.uplink_leaf_end(leaf), cfg.uplink_spine_end(leaf)
        _sh.run(["ip", "-n", sw, "link", "add", a, "type", "veth", "peer", "name", b])
        _sh.run(["ip", "-n", sw, "link", "set", a, "master", br])
        _sh.run(["ip", "-n", sw, "link", "set", b, "master", cfg.spine_bridge])
        _sh.run(["ip", "-n", sw, "link", "set", a, "up"])
        _sh.run(["ip", "-n", sw, "link", "set", b, "up"])
        shape(sw, a, cfg.uplink_bps)  # leaf -> spine
        shape(sw, b, cfg.uplink_bps)  # spine -> leaf
    for node in range(cfg.nodes):
        ns = cfg.node_ns(node)
        _add_ns(cfg.prefix, ns)
        _attach_host(cfg, ns, cfg.node_port(node), cfg.node_addr(node), cfg.leaf_of(node))
    if cfg.foreign_hosts:
        for side in (0, 1):
            ns = cfg.foreign_ns(side)
            _add_ns(cfg.prefix, ns)
            _attach_host(cfg, ns, cfg.foreign_port(side), cfg.foreign_addr(side), cfg.foreign_leaf(side))


def up(cfg: LabConfig) -> dict[str, Any]:
    """Bring the lab up. Idempotent: an identical healthy lab is left alone; one whose shaping drifted
    (a killed run's uplink change, a hand-made ``tc`` change, a deleted qdisc) is re-shaped; anything
    else with the same prefix (a different size, a half-built lab after a crash) is torn down and
    rebuilt."""
    require_lab()
    current = state.read(cfg.prefix)
    if current and current.get("up_complete") and current.get("config") == cfg.to_dict():
        problems = _verify(cfg)
        if not problems:
            drift = _drift(cfg)
            if not drift:
                return status(cfg.prefix) | {"action": "already up"}
            refuse_if_busy(cfg.prefix, "re-shaping it")
            _reshape(cfg, drift)
            return status(cfg.prefix) | {"action": "re-shaped", "repaired": [d["problem"] for d in drift]}
    refuse_if_busy(cfg.prefix, f"rebuilding it as {cfg.nodes} nodes on {cfg.leaves} leaves")
    if current or list_namespaces(cfg.prefix) or _root_links(cfg.prefix):
        down(cfg.prefix)
    with state.locked(cfg.prefix) as st:
        st.update(state.empty_state())
        st["config"] = cfg.to_dict()
        # `ip netns add` bind-mounts /run/netns on first use; remember whether the lab did that (also in a
        # marker beside the state files, so a lab whose state file was lost still unmounts it).
        st["netns_mount_preexisting"] = netns_mounted()
        if not st["netns_mount_preexisting"]:
            _mount_marker().touch()
        st["shaping"] = {"uplink": format_rate(cfg.uplink_bps), "node_link": format_rate(cfg.node_link_bps)}
    try:
        _build(cfg)
    except BaseException:
        down(cfg.prefix)
        raise
    with state.locked(cfg.prefix) as st:
        st["up_complete"] = True
    return status(cfg.prefix) | {"action": "created"}


def _reshape(cfg: LabConfig, drift: list[dict[str, Any]]) -> None:
    """Put every drifted link end back at the rate ``lab up`` gave it."""
    for d in drift:
        shape(d["namespace"], d["device"], d["want_bps"])
    with state.locked(cfg.prefix) as st:
        st["shaping"] = {"uplink": format_rate(cfg.uplink_bps), "node_link": format_rate(cfg.node_link_bps)}


# ---------------------------------------------------------------------------------------------- status
def _verify(cfg: LabConfig) -> list[str]:
    problems: list[str] = []
    have = set(list_namespaces(cfg.prefix))
    want = [cfg.switch_ns] + [cfg.node_ns(n) for n in range(cfg.nodes)]
    if cfg.foreign_hosts:
        want += [cfg.foreign_ns(0), cfg.foreign_ns(1)]
    problems += [f"namespace {n} missing" for n in want if n not in have]
    return problems


def _drift(cfg: LabConfig) -> list[dict[str, Any]]:
    """Link ends whose htb class is missing or whose rate is not the one ``lab up`` set.

    A run's uplink change is expected while that run holds the lab (the state records the rate it
    set); after the run (or after ``kill -9`` of it) the uplinks must be back at the lab's rate. Before,
    only the uplink classes' existence was checked, so a killed ``uplink_change`` run left 20mbit
    uplinks that every later run used while its manifest said 200mbit."""
    st = state.read(cfg.prefix) or {}
    run_rate = str((st.get("shaping") or {}).get("uplink") or "")
    running = state.claimed_elsewhere(cfg.prefix)
    drift: list[dict[str, Any]] = []
    for ns, dev, want, kind in shaped_links(cfg):
        have = read_rate(ns, dev)
        if have is not None and _same_rate(have, want):
            continue
        if (have is not None and kind == "uplink" and running and run_rate
                and _same_rate(have, parse_rate(run_rate))):
            continue  # the running lab run's uplink change
        where = dev if ns == cfg.switch_ns else f"{dev} in {ns}"
        what = ("not shaped (no htb class)" if have is None
                else f"shaped at {format_rate(have)}, not {format_rate(want)}")
        drift.append({"namespace": ns, "device": dev, "want_bps": want, "have_bps": have,
                      "problem": f"{kind} {where} {what}; `lab up` with the same shape (or the next "
                                 "`lab run`) re-shapes it"})
    return drift


def status(prefix: str = "fp-") -> dict[str, Any]:
    """What exists now: namespaces, uplink rates as tc reports them, live recorded processes."""
    check_prefix(prefix)
    st = state.read(prefix)
    namespaces = list_namespaces(prefix) if _sh.lab_unavailable_reason() is None else []
    out: dict[str, Any] = {"prefix": prefix, "up": False, "namespaces": namespaces, "state_file": None}
    if st is None:
        out["problems"] = [] if not namespaces else ["namespaces without a state file; run `lab down`"]
        return out
    out["state_file"] = str(state.state_path(prefix))
    live = [p for p in st["pids"] if state.proc_start_time(p["pid"]) == p["start"]]
    out["processes"] = live
    out["cgroups"] = [c for c in st["cgroups"] if Path(c).exists()]
    if not st.get("config"):
        out["problems"] = ["incomplete state; run `lab down`"]
        return out
    cfg = LabConfig.from_dict(st["config"])
    problems = _verify(cfg) if st.get("up_complete") else ["lab up did not finish; run `lab down`"]
    out["up"] = not problems
    out["config"] = st["config"]
    if not problems:
        out["uplink_rates"] = {
            dev: format_rate(read_rate(cfg.switch_ns, dev) or 0)
            for leaf in range(cfg.leaves)
            for dev in (cfg.uplink_leaf_end(leaf), cfg.uplink_spine_end(leaf))
        }
        drift = _drift(cfg)
        out["drift"] = [{k: v for k, v in d.items() if k != "problem"} for d in drift]
        problems = problems + [d["problem"] for d in drift]
    out["problems"] = problems
    return out


def load(prefix: str = "fp-") -> LabConfig:
    """The config of the lab that is up now; InputError telling how to start one when none is."""
    check_prefix(prefix)
    st = state.read(prefix)
    if not st or not st.get("up_complete") or not st.get("config"):
        raise InputError(f"no fabric lab with prefix {prefix!r} is up; run `fabricpace lab up` first")
    cfg = LabConfig.from_dict(st["config"])
    problems = _verify(cfg)
    if problems:
        raise LabError(f"lab {prefix!r} is damaged ({problems[0]}); run `fabricpace lab down` and `lab up`")
    return cfg


# ---------------------------------------------------------------------------------------------- down
def _end_processes(pids: list[int], *, grace_s: float = 3.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in pids if state.proc_start_time(p) is not None]
        for p in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, sig)
        deadline = time.monotonic() + grace_s
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if state.proc_start_time(p) is not None and not _zombie(p)]
            time.sleep(0.05)
        if not alive:
            return


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _ns_pids(ns: str) -> list[int]:
    out = _sh.run(["ip", "netns", "pids", ns], check=False).stdout
    return [int(x) for x in out.split() if x.isdigit()]


def _remove_cgroups(prefix: str, recorded: list[str]) -> list[str]:
    left: list[str] = []
    root = cgroup_root(prefix)
    paths = {Path(c) for c in recorded}
    if root.is_dir():
        paths |= {p for p in root.iterdir() if p.is_dir()} | {root}
    # Children before parents.
    for path in sorted(paths, key=lambda p: len(p.parts), reverse=True):
        if not path.exists():
            continue
        try:
            path.rmdir()
        except OSError:
            left.append(str(path))
    return left


def down(prefix: str = "fp-") -> dict[str, Any]:
    """Remove everything the lab with ``prefix`` made, also after a crash. Safe to run twice."""
    check_prefix(prefix)  # first: everything below matches names by this prefix
    require_lab()
    st = state.read(prefix) or state.empty_state()
    removed: dict[str, Any] = {"prefix": prefix, "processes": 0, "namespaces": [], "links": [], "cgroups": 0}
    # 1. Processes: the recorded ones (start time must match) and anything still inside our namespaces.
    recorded = [p["pid"] for p in st["pids"] if state.proc_start_time(p["pid"]) == p["start"]]
    namespaces = sorted(set(list_namespaces(prefix)) | {n for n in st["namespaces"] if n.startswith(prefix)})
    inside = [pid for ns in namespaces if (NETNS_DIR / ns).exists() for pid in _ns_pids(ns)]
    victims = sorted(set(recorded) | set(inside) - {os.getpid()})
    _end_processes(victims)
    removed["processes"] = len(victims)
    # 2. cgroups (empty now that their processes are gone).
    left = _remove_cgroups(prefix, st["cgroups"])
    removed["cgroups"] = len(st["cgroups"])
    # 3. Namespaces (their veths and bridges go with them) and links stranded in the root namespace.
    for ns in namespaces:
        if (NETNS_DIR / ns).exists() and _sh.ok(["ip", "netns", "del", ns]):
            removed["namespaces"].append(ns)
    for link in _root_links(prefix):
        if _sh.ok(["ip", "link", "del", link]):
            removed["links"].append(link)
    # 4. The /run/netns mount, when the lab created it and nothing else lives there now.
    made_mount = st.get("netns_mount_preexisting") is False or _mount_marker().exists()
    if made_mount and netns_mounted() and not any(NETNS_DIR.iterdir()):
        _sh.ok(["umount", str(NETNS_DIR)])
        removed["unmounted"] = str(NETNS_DIR)
    if not netns_mounted():
        with contextlib.suppress(FileNotFoundError):
            _mount_marker().unlink()
    leftovers = list_namespaces(prefix) + _root_links(prefix) + left
    if leftovers:
        raise LabError(f"lab down could not remove {', '.join(leftovers)}; see `ip netns list` / `ip link`")
    state.remove(prefix)
    return removed
