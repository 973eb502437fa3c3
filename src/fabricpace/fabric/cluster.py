"""Cluster files: the validated description of a GPU cluster's fabric, and the presets fabricpace ships.

A cluster file is YAML (documented in docs/cluster-files.md). It names the node count, GPUs per node,
the intra-node fabric (NVSwitch/NVLink or PCIe), the NICs (one per GPU on rails, or per node), the
scale-out topology (single switch, leaf-spine / two-tier fat tree, rail-optimized), routing (ECMP flow
hashing with a seed, or packet spraying / adaptive routing), latencies, and the model's free parameters
(``tuning``), which ``fabricpace collective --calibrate`` fits from nccl-tests logs.

The pydantic models below *are* the in-memory cluster: they are frozen (hashable, safe to share with the
simulator) and every field is validated with a message that names the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fabricpace._errors import ConfigError, InputError
from fabricpace._yaml import first_error, load_yaml_text, read_text, unknown_key_hint

PRESET_DIR = Path(__file__).resolve().parent.parent / "data" / "clusters"

_FROZEN = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class IntraNode(BaseModel):
    """The fabric inside one node. ``bandwidth_gbytes`` is per GPU, one direction, GB/s (NVLink4: 450)."""

    model_config = _FROZEN
    kind: Literal["nvswitch", "nvlink", "pcie"] = "nvswitch"
    bandwidth_gbytes: float = Field(default=450.0, gt=0)
    latency_us: float = Field(default=0.6, ge=0)


class Nics(BaseModel):
    """Scale-out NICs of one node: ``per: gpu`` means one NIC per GPU on its own rail."""

    model_config = _FROZEN
    per: Literal["gpu", "node"] = "gpu"
    count: int = Field(default=8, ge=1, le=64)
    speed_gbps: float = Field(default=400.0, gt=0)


class Network(BaseModel):
    """Scale-out topology and routing.

    ``topology``: single_switch (non-blocking), leaf_spine (every NIC of a node on the node's leaf),
    rail_optimized (NIC r of every node in a group on rail switch r). ``spines`` is the number of equal-cost
    uplink paths per leaf; ``oversubscription`` = leaf downlink capacity / uplink capacity (2 means 2:1).
    ``routing``: ecmp (each connection hashed onto one path, seeded), spray / adaptive (traffic spread
    evenly over all paths).
    """

    model_config = _FROZEN
    topology: Literal["single_switch", "leaf_spine", "rail_optimized"] = "rail_optimized"
    nodes_per_leaf: int = Field(default=32, ge=1)
    spines: int = Field(default=16, ge=1)
    oversubscription: float = Field(default=1.0, ge=1.0)
    routing: Literal["ecmp", "spray", "adaptive"] = "ecmp"
    ecmp_seed: int = Field(default=0, ge=0)
    qps_per_connection: int = Field(default=1, ge=1, le=16)
    hop_latency_us: float = Field(default=0.6, ge=0)
    nic_latency_us: float = Field(default=2.0, ge=0)


class Tuning(BaseModel):
    """Free parameters of the collective model (see collectives.py); ``--calibrate`` fits the efficiencies,
    ``base_us`` and ``net_overhead_us``.

    ``net_efficiency``: share of NIC line rate a bandwidth-bound ring reaches (busbw / line rate).
    ``tree_efficiency``: the same for NCCL's tree (a chain through the node's GPUs, a binary tree across
    nodes; LL, LL128 or Simple).
    ``nvls_tree_efficiency``: the same for NVLS-tree (the node reduces in the NVSwitch, Simple protocol, its
    own channels and chunk sizes): NCCL models its bandwidth separately from the tree's (tuning.cc), and
    it is a different pipeline, so it has its own efficiency.
    ``base_us``: fixed cost of one call (launch, pipeline fill), Simple protocol.
    ``nvlink_efficiency``: share of the intra-node link rate a ring reaches.
    ``latency_scale``: multiplies the per-hop latencies of the cluster file (kept at 1 by calibration:
    two node counts cannot tell a per-hop latency from the fixed cost).
    ``net_overhead_us``: cost of one network operation posted by NCCL's proxy. A ring that spans nodes is
    paced by its proxies, so every ring step costs at least this (three times with the Simple protocol:
    send, receive, acknowledge), NCCL's ``getNetOverhead`` rule; 1 us is NCCL's own value. Fitted by
    ``--calibrate`` (EFA's per-message cost is several times InfiniBand's).
    ``tuner``: who picks the algorithm and protocol: ``nccl`` (NCCL's cost model, with NCCL's constants)
    or ``aws-ofi-p5`` (the region tables of AWS's aws-ofi-nccl tuner plugin for p5; fabric/tuner.py).
    ``channels``: NCCL channels (parallel rings/trees). ``nvls``: NVLink SHARP available (H100 NVSwitch),
    with its intra-node all-reduce ``nvls_busbw_gbytes``. ``ll128_across_nodes``: false where NCCL leaves
    LL128 off for rings and trees that span nodes: it enables it only when a GPU reaches its NIC through
    PCIe switches (PXB), or on Hopper and later through another GPU (PXN) (src/graph/tuning.cc of the
    NCCL 2.2x releases); a NIC behind the CPU, as on GH200 (C2C to Grace, then PCIe: PHB), is neither.
    ``ring_floor``: how a ring step's proxy floor meets its data: ``added`` (the floor, then the data,
    NCCL's own estimate) or ``overlapped`` (each step takes max(floor, hop + its data): a floor set by a
    per-message cost of the transport that the data hides); calibration keeps the one that fits its rows
    better. ``source``: defaults, or the logs of a fit;
    ``calibrated_sizes``: the size range of the rows that fit used.
    """

    model_config = _FROZEN
    net_efficiency: float = Field(default=0.92, gt=0, le=1.0)
    tree_efficiency: float = Field(default=0.80, gt=0, le=1.0)
    nvls_tree_efficiency: float = Field(default=0.80, gt=0, le=1.0)
    base_us: float = Field(default=8.4, ge=0)
    nvlink_efficiency: float = Field(default=0.80, gt=0, le=1.0)
    latency_scale: float = Field(default=1.0, gt=0)
    net_overhead_us: float = Field(default=1.0, ge=0)
    tuner: Literal["nccl", "aws-ofi-p5"] = "nccl"
    channels: int = Field(default=16, ge=1, le=64)
    nvls: bool = False
    nvls_busbw_gbytes: float = Field(default=480.0, gt=0)
    ll128_across_nodes: bool = True
    ring_floor: Literal["added", "overlapped"] = "added"
    source: str = "defaults"
    # [smallest, largest] size in bytes of the rows a calibration fitted (written by --calibrate); predictions
    # outside it get a note: the fitted fixed cost carries the large sizes' fixed costs
    calibrated_sizes: tuple[int, int] | None = None

    @model_validator(mode="after")
    def _sizes_in_order(self) -> Tuning:
        lo_hi = self.calibrated_sizes
        if lo_hi is not None and not 0 < lo_hi[0] <= lo_hi[1]:
            raise ValueError(f"calibrated_sizes {list(lo_hi)}: expected [smallest, largest] bytes, both > 0")
        return self


class Cluster(BaseModel):
    """A cluster: nodes, GPUs per node, fabric, routing and the model's tuning. Frozen."""

    model_config = _FROZEN
    name: str = Field(min_length=1)
    description: str = ""
    nodes: int = Field(ge=1, le=1_000_000)
    gpus_per_node: int = Field(default=8, ge=1, le=128)
    intra_node: IntraNode = Field(default_factory=IntraNode)
    nics: Nics = Field(default_factory=Nics)
    network: Network = Field(default_factory=Network)
    tuning: Tuning = Field(default_factory=Tuning)

    @model_validator(mode="after")
    def _consistent(self) -> Cluster:
        if (
            self.nics.per == "gpu"
            and self.nics.count % self.gpus_per_node
            and self.gpus_per_node % self.nics.count
        ):
            raise ValueError(
                f"nics.count={self.nics.count} with per: gpu must divide or be a multiple of "
                f"gpus_per_node={self.gpus_per_node}"
            )
        return self

    # ---- derived topology attributes -------------------------------------------------------------
    @property
    def nodes_per_leaf(self) -> int:
        """Nodes under one leaf (all nodes for a single switch)."""
        if self.network.topology == "single_switch":
            return self.nodes
        return self.network.nodes_per_leaf

    @property
    def leaves(self) -> int:
        """Number of leaf groups (1 for a single switch). For rail-optimized, groups of rail switches."""
        return -(-self.nodes // self.nodes_per_leaf)

    def leaf_of(self, node: int) -> int:
        """Leaf (group) index of ``node``; 0 for every node on a single switch."""
        if not 0 <= node < max(self.nodes, 1):
            raise ConfigError(f"cluster {self.name!r}: node {node} outside 0..{self.nodes - 1}")
        return node // self.nodes_per_leaf

    @property
    def nic_bytes_per_s(self) -> float:
        """Line rate of one NIC in bytes/s."""
        return self.nics.speed_gbps * 1e9 / 8.0

    @property
    def node_net_bytes_per_s(self) -> float:
        """Scale-out line rate of one node (all NICs) in bytes/s."""
        return self.nic_bytes_per_s * self.nics.count

    def with_tuning(self, **changes: Any) -> Cluster:
        """A copy with some tuning fields replaced (validated)."""
        return self.model_copy(update={"tuning": Tuning(**{**self.tuning.model_dump(), **changes})})

    def to_yaml(self) -> str:
        """The cluster as a YAML cluster file."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def preset_names() -> list[str]:
    """Names of the presets shipped with fabricpace."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def _field_path(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def cluster_from_dict(data: Any, *, where: str) -> Cluster:
    """Validate a parsed cluster document; ConfigError names ``where`` and the field."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where}: expected a YAML mapping (name, nodes, gpus_per_node, ...), got {type(data).__name__}"
        )
    try:
        return Cluster.model_validate(data)
    except ValidationError as exc:
        err = first_error(exc)  # a misspelt key first: it also makes the real key "missing"
        loc = tuple(err.get("loc", ()))
        field = _field_path(loc)
        msg = err.get("msg", "invalid")
        if err.get("type") == "extra_forbidden":
            hint = unknown_key_hint(Cluster, loc).strip(" ()")
            raise ConfigError(
                f"{where}: field {field}: {msg} (an unknown key{'; ' + hint if hint else ''}); fix the "
                "spelling or remove it (see docs/cluster-files.md)"
            ) from exc
        got = err.get("input")
        got_txt = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
        raise ConfigError(
            f"{where}: field {field}: {msg}{got_txt}; fix it (see docs/cluster-files.md)"
        ) from exc


def load_cluster(name_or_path: str | Path) -> Cluster:
    """Load a preset by name (``dgx-h100-ib``, ``p5-efa``, ``roce-leaf-spine-2to1``, ``single-switch``)
    or a cluster YAML file. Raises ConfigError naming the file and field on bad input."""
    if isinstance(name_or_path, Cluster):  # already loaded: convenient for callers passing either
        return name_or_path
    text = str(name_or_path)
    path = Path(text)
    if not path.exists() and (PRESET_DIR / f"{text}.yaml").exists():
        path = PRESET_DIR / f"{text}.yaml"
    if not path.exists():
        raise ConfigError(
            f"cluster {text!r}: no such file or preset; use a YAML path or one of {', '.join(preset_names())}"
        )
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory; give a cluster YAML file or a preset name")
    raw = read_text(path, what="cluster file")
    try:
        data = load_yaml_text(raw, source=str(path))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{path}{line}: {problem}; fix the YAML syntax") from exc
    return cluster_from_dict(data, where=str(path))


def save_cluster(cluster: Cluster, path: str | Path) -> Path:
    """Write ``cluster`` as a YAML file atomically (temp file + rename); never half-written."""
    target = Path(path)
    if not target.parent.is_dir():
        what = "is a file, not a folder" if target.parent.exists() else "folder does not exist"
        raise InputError(f"{target}: {target.parent} {what}; create the folder or choose another path")
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        tmp.write_text(cluster.to_yaml(), encoding="utf-8")
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target
