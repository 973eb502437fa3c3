"""Hosts files as launchers read them (Open MPI / DeepSpeed, MPICH / Intel MPI, one name a line).

``fabricpace place`` reads today's rank order from one and writes the proposed order in the same
format; ``fabricpace lab run --placement FILE`` replays such a file in the fabric lab. One line per
host: ``HOST [slots=N] [max_slots=M] [node=K] [leaf=L]``, ``HOST:N [node=K] [leaf=L]`` or a bare
``HOST`` (``#`` starts a comment; a comment made only of ``leaf=``/``node=`` tags is read as tags,
which is how a proposed hostfile keeps them). Every problem is an InputError naming ``file:line``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fabricpace._errors import InputError

_FIELD = re.compile(r"^(slots|max_slots|node)=(\d+)$")
_LEAF = re.compile(r"^leaf=([^\s=]+)$")  # a number or a switch name (ib-leaf-07): only equality matters
_MPICH = re.compile(r"^([^:\s]+):(\d+)$")  # MPICH / Intel MPI (Hydra): HOST:N
_NAME = re.compile(r"^[A-Za-z0-9_.@-]+$")  # a host name or address; Open MPI also allows user@host
_TAG = re.compile(r"^(?:leaf=[^\s=]+|node=\d+)$")  # what a proposed hostfile keeps in its comments
_SYNTAX = "expected 'HOST [slots=N] [max_slots=M] [node=K] [leaf=L]' or 'HOST:N'"
HOSTS_SYNTAX = (
    "Hosts file: one host per line in today's rank order, as the launcher reads it: Open MPI / DeepSpeed "
    "'HOST slots=N' (max_slots=M too), MPICH / Intel MPI 'HOST:N', or a bare 'HOST' (one name per line, "
    "as 'scontrol show hostnames' prints). Add 'leaf=L' (the leaf switch's number or name) or 'node=K' "
    "(the host's node index in the cluster file) to every line, on the line or after '#', to compare "
    "with the real topology; without them host i is taken to be node i. The proposed hostfile is "
    "written in the same format; --keep-tags keeps the tags after '#', where launchers ignore them "
    "and place reads them again."
)


@dataclass(frozen=True)
class Host:
    name: str
    slots: int | None
    node: int | None
    leaf: str | None
    line: int
    max_slots: int | None = None
    mpich: bool = False  # written HOST:N

    def render(self, *, tags: bool = False) -> str:
        if self.mpich:
            text = f"{self.name}:{self.slots}"
        else:
            text = (
                self.name
                + (f" slots={self.slots}" if self.slots is not None else "")
                + (f" max_slots={self.max_slots}" if self.max_slots is not None else "")
            )
        # Tags ride in a comment: launchers skip it (Open MPI, DeepSpeed, Hydra), place reads it back.
        kept = (f" node={self.node}" if self.node is not None else "") + (
            f" leaf={self.leaf}" if self.leaf is not None else ""
        )
        return text + (f"  #{kept}" if kept and tags else "")


def _bad_name(path: Path, i: int, name: str) -> InputError:
    if "," in name:
        fix = "a comma-separated list is not a hosts file; write one host per line (tr , '\\n' < list)"
    elif "[" in name:
        fix = f"a Slurm node list; expand it with scontrol show hostnames '{name}' > hosts.txt"
    elif ":" in name:
        fix = "MPICH hostfiles write HOST:N with N the number of processes (node01:8)"
    elif "=" in name:
        fix = "the host name comes first on the line"
    else:
        fix = "a host name has only letters, digits, '.', '-', '_' (and user@ for Open MPI)"
    return InputError(f"{path}:{i}: cannot read host {name!r}; {fix}")


def parse_hosts(path: Path) -> list[Host]:
    """Read a hosts file; InputError naming file:line for anything it cannot read."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); give a hosts file with one "
            "'HOST [slots=N] [leaf=L]' per line"
        ) from exc
    except OSError as exc:
        raise InputError(f"{path}: cannot read the hosts file ({exc.strerror or exc})") from exc
    hosts: list[Host] = []
    seen: dict[str, int] = {}
    nodes: dict[int, int] = {}
    for i, raw in enumerate(text.splitlines(), start=1):
        line, _, comment = raw.partition("#")
        line = line.strip()
        if not line:
            continue
        name, *rest = line.split()
        # A proposed hostfile keeps leaf=/node= after '#': read them back; other comments stay comments.
        tail = comment.split()
        if tail and all(_TAG.match(t) for t in tail):
            rest += tail
        mpich = _MPICH.match(name)
        if mpich is not None:
            name = mpich.group(1)
        if not _NAME.match(name):
            raise _bad_name(path, i, name)
        vals: dict[str, int] = {}
        leaf: str | None = None
        for tok in rest:
            m = _FIELD.match(tok)
            lm = _LEAF.match(tok)
            if m is None and lm is None:
                raise InputError(f"{path}:{i}: cannot read {tok!r}; {_SYNTAX}")
            key = m.group(1) if m is not None else "leaf"
            if key in vals or (key == "leaf" and leaf is not None):
                raise InputError(f"{path}:{i}: {key}= is given twice; give it once")
            if m is not None:
                vals[key] = int(m.group(2))
            elif lm is not None:
                leaf = lm.group(1)
        if mpich is not None:
            if "slots" in vals or "max_slots" in vals:
                raise InputError(
                    f"{path}:{i}: {line!r} gives both HOST:N (MPICH) and slots=; use one of them"
                )
            vals["slots"] = int(mpich.group(2))
        field = f"{name}:{vals.get('slots')}" if mpich is not None else f"slots={vals.get('slots')}"
        if vals.get("slots") == 0:
            raise InputError(
                f"{path}:{i}: {field}: a host with no slots runs no rank; remove the line or give N >= 1"
            )
        if "max_slots" in vals and vals["max_slots"] < vals.get("slots", 1):
            raise InputError(
                f"{path}:{i}: max_slots={vals['max_slots']} is below slots={vals.get('slots', 1)}; "
                "max_slots must be at least slots"
            )
        if name in seen:
            how = "HOST:N" if mpich is not None else "slots=N"
            raise InputError(
                f"{path}:{i}: host {name!r} listed twice (first on line {seen[name]}); list each host "
                f"once (use {how})"
            )
        seen[name] = i
        if "node" in vals:
            if vals["node"] in nodes:
                raise InputError(
                    f"{path}:{i}: node={vals['node']} is also on line {nodes[vals['node']]}; each host is "
                    "a different node of the cluster: give each its own node=K"
                )
            nodes[vals["node"]] = i
        hosts.append(
            Host(name, vals.get("slots"), vals.get("node"), leaf, i, vals.get("max_slots"), mpich is not None)
        )
    if not hosts:
        raise InputError(f"{path}: no hosts; write one host per line, e.g. 'node01 slots=8'")
    _check_consistent(hosts, path)
    return hosts


def _check_consistent(hosts: list[Host], path: Path) -> None:
    """One format, slots on every line or none, topology tags on every line or none."""
    first = hosts[0]
    for h in hosts[1:]:
        if h.mpich != first.mpich and h.slots is not None and first.slots is not None:
            a, b = (first, h) if first.mpich else (h, first)
            raise InputError(
                f"{path}:{h.line}: line {a.line} writes {a.name}:{a.slots} (MPICH) and line {b.line} "
                f"slots={b.slots} (Open MPI); a launcher reads one format: write every line the same way"
            )
        if (h.slots is None) != (first.slots is None):
            with_, without = (first, h) if first.slots is not None else (h, first)
            given = f"{with_.name}:{with_.slots}" if with_.mpich else f"slots={with_.slots}"
            how = "HOST:N" if with_.mpich else "slots=N"
            raise InputError(
                f"{path}:{without.line}: no process count here, but line {with_.line} gives {given}; "
                f"give {how} on every line or on none"
            )
        tagged, first_tagged = h.leaf is not None or h.node is not None, first.leaf is not None or (
            first.node is not None
        )
        if tagged != first_tagged:
            untagged, other = (h, first) if first_tagged else (first, h)
            raise InputError(
                f"{path}:{untagged.line}: no leaf=L or node=K here, but line {other.line} has one; "
                "tag every line (or none: then host i is taken to be node i)"
            )
