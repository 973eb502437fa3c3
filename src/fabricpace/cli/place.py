"""fabricpace place: rank placement that keeps ring neighbours inside a leaf.

    fabricpace place --cluster roce-leaf-spine-2to1 --hosts hosts.txt
    fabricpace place --cluster my.yaml --hosts hosts.txt --bytes 5G --out hosts.placed --format json

The hosts file lists one host per line in today's rank order, MPI/DeepSpeed style:
``HOST [slots=N] [max_slots=M] [node=K] [leaf=L]`` (``#`` starts a comment). A host's leaf is ``leaf=L``
when given, else the cluster's leaf of ``node=K``, else the leaf of the node at the host's line
position — an order that is packed by construction, so without ``leaf=``/``node=`` the command can only
say that it was told nothing to improve (and says so). The
proposed order groups hosts by leaf (stable), which minimizes the ring edges that cross the spine;
the expected cross-leaf traffic uses a ring all-reduce over the nodes (2(n-1)/n x S per edge).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import typer

from fabricpace._errors import InputError
from fabricpace.cli._common import check_format, check_writable, count, parse_size

_FIELD = re.compile(r"^(slots|max_slots|node)=(\d+)$")
_LEAF = re.compile(r"^leaf=([^\s=]+)$")  # a number or a switch name (ib-leaf-07): only equality matters
_SYNTAX = "expected 'HOST [slots=N] [max_slots=M] [node=K] [leaf=L]'"


@dataclass(frozen=True)
class Host:
    name: str
    slots: int | None
    node: int | None
    leaf: str | None
    line: int
    max_slots: int | None = None

    def render(self) -> str:
        return (
            self.name
            + (f" slots={self.slots}" if self.slots is not None else "")
            + (f" max_slots={self.max_slots}" if self.max_slots is not None else "")
        )


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
    seen: set[str] = set()
    for i, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, *rest = line.split()
        vals: dict[str, int] = {}
        leaf: str | None = None
        for tok in rest:
            m = _FIELD.match(tok)
            if m is not None:
                vals[m.group(1)] = int(m.group(2))
                continue
            lm = _LEAF.match(tok)
            if lm is None:
                raise InputError(f"{path}:{i}: cannot read {tok!r}; {_SYNTAX}")
            leaf = lm.group(1)
        if name in seen:
            raise InputError(f"{path}:{i}: host {name!r} listed twice; list each host once (use slots=N)")
        seen.add(name)
        hosts.append(
            Host(name, vals.get("slots"), vals.get("node"), leaf, i, vals.get("max_slots"))
        )
    if not hosts:
        raise InputError(f"{path}: no hosts; write one host per line, e.g. 'node01 slots=8'")
    return hosts


def host_leaves(hosts: list[Host], cluster: object, path: Path) -> list[str]:
    """Each host's leaf label: ``leaf=`` as written, else the cluster's leaf number of its node."""
    from fabricpace._errors import ConfigError

    leaves: list[str] = []
    n_nodes = int(getattr(cluster, "nodes", 0))
    for pos, h in enumerate(hosts):
        if h.leaf is not None:
            leaves.append(h.leaf)
            continue
        node = h.node if h.node is not None else pos
        if node >= n_nodes:
            raise InputError(
                f"{path}:{h.line}: node {node} is outside the cluster's {n_nodes} nodes; "
                "add node=K or leaf=L, or use a larger cluster file"
            )
        try:
            leaves.append(str(int(cluster.leaf_of(node))))  # type: ignore[attr-defined]
        except ConfigError as exc:
            raise InputError(f"{path}:{h.line}: {exc}") from exc
    return leaves


def _label(leaf: str) -> int | str:
    """A leaf as JSON shows it: numbers stay numbers."""
    return int(leaf) if leaf.isdigit() else leaf


def _human(n: float) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f} B"


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""

    @app.command()
    def place(
        cluster: str = typer.Option(..., "--cluster", help="cluster preset name or YAML file"),
        hosts: Path = typer.Option(..., "--hosts", help="hosts file in today's rank order"),
        nbytes: str = typer.Option("1G", "--bytes", help="all-reduce size for the traffic estimate"),
        out: Path | None = typer.Option(
            None, "--out", help="write the proposed hostfile here (never overwrites)"
        ),
        fmt: str = typer.Option("table", "--format", help="table|json"),
    ) -> None:
        """Propose a rank order that keeps ring neighbours inside a leaf; print cross-leaf traffic."""
        from fabricpace.fabric import load_cluster
        from fabricpace.pacing.placement import plan_placement

        check_format(fmt, ("table", "json"))
        size = parse_size(nbytes, option="--bytes")
        if out is not None and out.exists():
            raise InputError(f"--out {out}: file exists; choose a new name (fabricpace never overwrites it)")
        if out is not None:
            check_writable(out, option="--out", creates_folders=False)
        cl = load_cluster(cluster)
        items = parse_hosts(hosts)
        leaves = host_leaves(items, cl, hosts)
        ids: dict[str, int] = {}
        plan = plan_placement([ids.setdefault(v, len(ids)) for v in leaves], nbytes=size)
        # Leaves taken from line positions describe the given order as packed: nothing to improve
        # is then what the command was told, not what it found.
        from_positions = all(h.leaf is None and h.node is None for h in items)
        ordered = [items[i] for i in plan.order]
        hostfile = "".join(h.render() + "\n" for h in ordered)
        if out is not None:
            out.write_text(hostfile)
        if fmt == "json":
            print(
                json.dumps(
                    {
                        "cluster": cl.name,
                        "hosts": [h.name for h in ordered],
                        "order": list(plan.order),
                        "leaves": [_label(leaves[i]) for i in plan.order],
                        "cross_leaf_edges": {"before": plan.edges_before, "after": plan.edges_after},
                        "cross_leaf_bytes": {
                            "before": plan.bytes_before,
                            "after": plan.bytes_after,
                            "all_reduce_bytes": size,
                        },
                        "hostfile": str(out) if out is not None else None,
                        "leaves_from": "line positions" if from_positions else "hosts file",
                    }
                )
            )
            return
        from rich.console import Console

        con = Console(soft_wrap=True, highlight=False, markup=False)  # paths and names as given: no markup
        n_leaves = count(len(set(leaves)), "leaf", "leaves")
        con.print(f"cluster {cl.name}: {count(len(items), 'host')} on {n_leaves}")
        if from_positions:
            con.print(
                f"{hosts}: no host says node=K or leaf=L, so host i is taken to be node i of the cluster "
                "(a packed order); add leaf=L to each line (the leaf switch the host hangs under) to "
                "compare against the real topology"
            )
        con.print(
            f"ring edges crossing a leaf: {plan.edges_before} -> {plan.edges_after}; "
            f"cross-leaf traffic per all-reduce of {_human(size)}: "
            f"{_human(plan.bytes_before)} -> {_human(plan.bytes_after)}"
        )
        if not plan.improves and not from_positions:
            con.print("the current order is already optimal; keep it")
        con.print("proposed hostfile:" if out is None else f"proposed hostfile (written to {out}):")
        print(hostfile, end="")
