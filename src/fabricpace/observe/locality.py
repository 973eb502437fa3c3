"""Locality probe: the cheap facts that explain locality-driven variance (host, CPU set, NUMA, GPU, NICs).

Read once at start from the environment and sysfs; ``nvidia-smi topo -m`` is run (with a timeout)
only when it exists. Unknown values stay None, so the ranks table has nulls rather than guesses.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

SYS = Path("/sys")


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def leaf_name() -> str | None:
    """Name of the leaf switch this node hangs off, when the launch environment says: ``FABRICPACE_LEAF``
    (set it from your topology), else Slurm's ``SLURM_TOPOLOGY_ADDR`` (topology/tree plugin: the switch
    names from the top switch down to the leaf, then the node, separated by periods; the leaf is the
    component before the node). Rank 0 numbers the names by first appearance for ``ranks.leaf``."""
    explicit = os.environ.get("FABRICPACE_LEAF", "").strip()
    if explicit:
        return explicit
    parts = [p for p in os.environ.get("SLURM_TOPOLOGY_ADDR", "").strip().split(".") if p]
    return parts[-2] if len(parts) >= 2 else None


def parse_cpulist(text: str) -> set[int]:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def compact_cpulist(cpus: set[int]) -> str:
    """{0, 1, 2, 3, 8} -> '0-3,8'."""
    out: list[str] = []
    for c in sorted(cpus):
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == c - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        elif out and "-" not in out[-1] and int(out[-1]) == c - 1:
            out[-1] = f"{out[-1]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)


def numa_of_cpus(cpus: set[int], sys_root: Path = SYS) -> int | None:
    """The NUMA node holding most of ``cpus`` (None when sysfs has no node information)."""
    best: tuple[int, int] | None = None
    for node_dir in sorted((sys_root / "devices/system/node").glob("node[0-9]*")):
        try:
            overlap = len(cpus & parse_cpulist((node_dir / "cpulist").read_text()))
        except OSError:
            continue
        node = int(node_dir.name[4:])
        if overlap and (best is None or overlap > best[0]):
            best = (overlap, node)
    return None if best is None else best[1]


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _read_numa(path: Path) -> int | None:
    # sysfs says -1 where the platform reports no NUMA affinity (single-socket hosts, many VMs): unknown,
    # not a node number a report should print or compare
    node = _read_int(path)
    return node if node is not None and node >= 0 else None


def nics(sys_root: Path = SYS) -> list[dict[str, Any]]:
    """Physical network interfaces (those with a device link) and their NUMA node."""
    out = []
    for dev in sorted((sys_root / "class/net").glob("*")):
        if not (dev / "device").exists():
            continue  # virtual (lo, veth, bridges)
        out.append({"name": dev.name, "numa": _read_numa(dev / "device/numa_node")})
    return out


def gpu_info(device: Any = None, sys_root: Path = SYS) -> dict[str, Any]:
    """Index, PCI bus id and NUMA node of ``device`` (the model's CUDA device; the current device when
    None) when CUDA is in use (empty dict otherwise). A process that put its model on ``cuda:k`` without
    ``set_device(k)`` has current device 0, so the model's device is the one to describe."""
    try:
        import torch

        if not torch.cuda.is_available():
            return {}
        idx = device.index if getattr(device, "index", None) is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        bus = getattr(props, "pci_bus_id", None)
        dom = getattr(props, "pci_domain_id", 0)
        devid = getattr(props, "pci_device_id", 0)
        pci = f"{dom:04x}:{bus:02x}:{devid:02x}.0" if isinstance(bus, int) else None
        numa = _read_numa(sys_root / f"bus/pci/devices/{pci}/numa_node") if pci else None
        return {"gpu": str(idx), "gpu_name": props.name, "gpu_pci": pci, "gpu_numa": numa}
    except Exception:  # locality is best effort; a probe failure must not stop the observer
        return {}


def nvidia_topo(timeout_s: float) -> str | None:
    """Output of ``nvidia-smi topo -m`` when the tool exists (None otherwise or on timeout)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def probe(rank: int, device: Any = None) -> dict[str, Any]:
    """This rank's row for ranks.parquet (contract columns + extra locality columns); ``device``: the
    model's CUDA device, if any."""
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        cpus = set()
    local_rank = _env_int("LOCAL_RANK")
    g = gpu_info(device)
    net = nics()
    return {
        "rank": rank,
        "node": _env_int("GROUP_RANK"),  # torchrun's node index; filled from host order otherwise
        "local_rank": local_rank if local_rank is not None else 0,
        "host": socket.gethostname(),
        "leaf": None,  # numbered by rank 0 from leaf_name (startup.ranks_table)
        "leaf_name": leaf_name(),
        "dp_rank": rank,
        "pp_stage": None,
        "tp_rank": None,
        "numa": numa_of_cpus(cpus) if cpus else None,
        "gpu": g.get("gpu"),
        "nic": ",".join(n["name"] for n in net) or None,
        "local_world_size": _env_int("LOCAL_WORLD_SIZE"),
        "cpu_affinity": compact_cpulist(cpus) if cpus else None,
        "gpu_pci": g.get("gpu_pci"),
        "gpu_numa": g.get("gpu_numa"),
        "nic_numa": ",".join("" if n["numa"] is None else str(n["numa"]) for n in net) or None,
        "pid": os.getpid(),
    }
