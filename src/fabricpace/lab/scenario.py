"""Lab scenarios: which ranks run where, on what fabric, with which faults. Validated with pydantic.

A scenario is a YAML file (or the name of a shipped one in ``fabricpace/data/lab_scenarios``)::

    name: throttled-rank
    world: 4                # ranks, one per node (--nodes overrides)
    steps: 60
    placement: contiguous   # interleaved (consecutive ranks alternate leaves), a node order [0, 2, 1, 3]
                            # or a hosts file (fabricpace place's; relative to this file)
    fabric: {leaves: 2, uplink: 200mbit, node_link: 1gbit}
    workload: {batch_per_rank: 64, device_ms_per_sample: 1.0, hidden: 192, layers: 3}
    faults:
      throttle: {ranks: [1], cpus: 0.03}                  # cgroup v1 CPU quota (CPUs)
      gc_noise: {ranks: all, heap: 200000, churn: 12000}  # object churn / GC pressure
      foreign_flow: {streams: 8, on_s: 1.5, off_s: 1.5}   # bulk TCP across the uplink (0/0: always on)
      uplink_change: {after_s: 8, rate: 50mbit}           # tc rate change mid-run
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fabricpace._errors import ConfigError, InputError
from fabricpace._yaml import parse_yaml, read_text, validate
from fabricpace.lab.config import parse_rate

SHIPPED = Path(__file__).resolve().parent.parent / "data" / "lab_scenarios"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_rate(v: str) -> str:
    """A tc rate; a ValueError (not InputError) so the message names the file and the field."""
    try:
        parse_rate(v)
    except InputError as exc:
        raise ValueError(str(exc)) from None
    return v


class FabricSpec(_Strict):
    leaves: int = Field(2, ge=1, le=16)
    uplink: str = "1gbit"
    node_link: str = "2gbit"

    @field_validator("uplink", "node_link")
    @classmethod
    def _rate(cls, v: str) -> str:
        return _check_rate(v)


class WorkloadSpec(_Strict):
    batch_per_rank: int = Field(64, ge=1)  # weak scaling: global batch = batch_per_rank × world
    device_ms_per_sample: float = Field(1.0, ge=0.0, le=100.0)  # accelerator time, waited for
    in_dim: int = Field(128, ge=1)
    hidden: int = Field(192, ge=1)
    layers: int = Field(3, ge=1, le=32)
    window: int = Field(20, ge=2)


def _once_each(ranks: list[int]) -> list[int]:
    """A ValueError for a rank listed twice ([1, 1] threw rank 1 twice: two throttle events, one cgroup)."""
    twice = sorted({r for r in ranks if ranks.count(r) > 1})
    if twice:
        raise ValueError(f"rank {twice[0]} is listed twice; list each rank once")
    return ranks


class ThrottleSpec(_Strict):
    ranks: list[int] = Field(..., min_length=1)  # [] was a fault that did nothing
    cpus: float = Field(0.05, ge=0.01, le=64.0)  # the cgroup quota's bound (it failed mid-run below it)

    @field_validator("ranks")
    @classmethod
    def _ranks(cls, v: list[int]) -> list[int]:
        return _once_each(v)


class GcNoiseSpec(_Strict):
    ranks: Literal["all"] | list[int] = Field("all", min_length=1)
    heap: int = Field(300_000, ge=0)
    churn: int = Field(20_000, ge=1)
    lifetime: int = Field(3, ge=1)

    @field_validator("ranks")
    @classmethod
    def _ranks(cls, v: Literal["all"] | list[int]) -> Literal["all"] | list[int]:
        return v if v == "all" else _once_each(list(v))


class ForeignFlowSpec(_Strict):
    streams: int = Field(4, ge=1, le=32)
    on_s: float = Field(0.0, ge=0.0)
    off_s: float = Field(0.0, ge=0.0)


class UplinkChangeSpec(_Strict):
    after_s: float = Field(..., ge=0.0)
    rate: str

    @field_validator("rate")
    @classmethod
    def _rate(cls, v: str) -> str:
        return _check_rate(v)


class FaultsSpec(_Strict):
    throttle: ThrottleSpec | None = None
    gc_noise: GcNoiseSpec | None = None
    foreign_flow: ForeignFlowSpec | None = None
    uplink_change: UplinkChangeSpec | None = None


class Scenario(_Strict):
    name: str
    description: str = ""
    expect: str = Field("", description="the failure mode this scenario should show (documentation)")
    world: int = Field(8, ge=2, le=64)
    steps: int = Field(200, ge=10)
    # contiguous | interleaved | node ids in rank order | a hosts file (lab/mirror.py resolves it)
    placement: str | list[int] = "contiguous"
    fabric: FabricSpec = Field(default_factory=lambda: FabricSpec.model_validate({}))
    workload: WorkloadSpec = Field(default_factory=lambda: WorkloadSpec.model_validate({}))
    faults: FaultsSpec = Field(default_factory=lambda: FaultsSpec.model_validate({}))

    @field_validator("placement")
    @classmethod
    def _placement(cls, v: str | list[int]) -> str | list[int]:
        if isinstance(v, list):
            if len(v) < 2 or any(n < 0 for n in v):
                raise ValueError("a node order lists each rank's node (0, 1, ...), e.g. [0, 2, 1, 3]")
            _once_each_node(v)
        elif not v.strip():
            raise ValueError("give contiguous, interleaved, a node order such as [0, 2, 1, 3] or a "
                             "hosts file")
        return v


def _once_each_node(nodes: list[int]) -> None:
    twice = sorted({n for n in nodes if nodes.count(n) > 1})
    if twice:
        raise ValueError(f"node {twice[0]} is listed twice; the lab runs one rank per node")


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.yaml"))


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A shipped scenario by name, or a YAML file; ConfigError naming the file and field on bad input."""
    text_name = str(name_or_path)
    if text_name in shipped_names():
        source = f"{text_name} (shipped)"
        text = (SHIPPED / f"{text_name}.yaml").read_text()
    else:
        path = Path(name_or_path)
        if path.is_dir():
            raise ConfigError(f"--scenario {text_name!r}: is a folder; give a scenario YAML file or one of "
                              f"{', '.join(shipped_names())}")
        if not path.is_file():
            raise ConfigError(f"--scenario {text_name!r}: not a shipped scenario "
                              f"({', '.join(shipped_names())}) and no such file")
        source, text = str(path), read_text(path, what="scenario file")
    sc = validate(Scenario, parse_yaml(text, source=source), source=source, docs="docs/lab.md")
    if isinstance(sc.placement, str) and sc.placement not in ("contiguous", "interleaved"):
        # A hosts file, relative to the scenario file (as a path in a config file reads)
        hosts = Path(sc.placement).expanduser()
        if not hosts.is_absolute() and source != f"{text_name} (shipped)":
            hosts = Path(name_or_path).parent / hosts
        if not hosts.is_file():
            raise ConfigError(f"{source}: field 'placement': {sc.placement!r} is not contiguous, "
                              "interleaved, a node order such as [0, 2, 1, 3], or an existing hosts file")
        sc = sc.model_copy(update={"placement": str(hosts)})
    if sc.fabric.leaves > sc.world:
        # The lab hangs at least one node off each leaf: leaves: 8 with world: 4 ran on 4 leaves while
        # the file said 8. (--nodes below the leaves is taken with a warning: the launcher's.)
        raise ConfigError(f"{source}: field 'fabric.leaves': {sc.fabric.leaves} leaves for world "
                          f"{sc.world}: every leaf needs a node of its own; set fabric.leaves to "
                          f"{sc.world} or fewer")
    if sc.faults.foreign_flow is not None and sc.fabric.leaves < 2:
        # It runs between the first and last leaf; on one leaf the run failed after its ranks started.
        raise ConfigError(f"{source}: field 'faults.foreign_flow': it crosses the uplink between two "
                          "leaves; set fabric.leaves to 2 or more, or remove the foreign flow")
    return sc
