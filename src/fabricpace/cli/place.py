"""fabricpace place: rank placement that keeps ring neighbours inside a leaf.

    fabricpace place --cluster roce-leaf-spine-2to1 --hosts hosts.txt
    fabricpace place --cluster my.yaml --hosts hosts.txt --bytes 5G --out hosts.placed --format json

The hosts file lists one host per line in today's rank order, as the launcher reads it:
``HOST [slots=N] [max_slots=M] [node=K] [leaf=L]`` (Open MPI, DeepSpeed), ``HOST:N [node=K] [leaf=L]``
(MPICH, Intel MPI) or a bare ``HOST`` (``#`` starts a comment; a comment made only of ``leaf=``/``node=``
tags is read as tags, which is how the proposed hostfile keeps them). A host's leaf is ``leaf=L``
when given, else the cluster's leaf of ``node=K``, else the leaf of the node at the host's line
position — an order that is packed by construction, so without ``leaf=``/``node=`` the command can only
say that it was told nothing to improve (and says so). The
proposed order groups hosts by leaf (stable), which minimizes the ring edges that cross the spine;
the expected cross-leaf traffic uses a ring all-reduce over the ranks (2(N-1)/N x S per edge, N the sum
of the slots; the cluster's GPUs per node per host when the file gives none). The proposed hostfile
is written in the input's format, so the launcher takes it as it is; ``--keep-tags`` keeps the tags
after ``#``.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from fabricpace._errors import InputError
from fabricpace.cli._common import check_format, check_writable, count, parse_size
from fabricpace.hostfile import HOSTS_SYNTAX, Host, parse_hosts

__all__ = ["HOSTS_SYNTAX", "Host", "host_leaves", "parse_hosts", "register"]

def host_leaves(hosts: list[Host], cluster: object, path: Path) -> list[str]:
    """Each host's leaf label: ``leaf=`` as written, else the cluster's leaf number of its node."""
    from fabricpace._errors import ConfigError

    leaves: list[str] = []
    n_nodes = int(getattr(cluster, "nodes", 0))
    name = getattr(cluster, "name", "?")
    if len(hosts) > n_nodes:
        raise InputError(
            f"{path}:{hosts[n_nodes].line}: host {n_nodes + 1} of {len(hosts)}, but cluster {name!r} has "
            f"{n_nodes} nodes; use a larger cluster file (nodes: {len(hosts)}) or fewer hosts"
        )
    for pos, h in enumerate(hosts):
        node = h.node if h.node is not None else pos
        if h.leaf is None or h.node is not None:
            if node >= n_nodes:
                raise InputError(
                    f"{path}:{h.line}: node {node} is outside the cluster's {n_nodes} nodes; "
                    "add node=K or leaf=L, or use a larger cluster file"
                )
            try:
                of_node = str(int(cluster.leaf_of(node)))  # type: ignore[attr-defined]
            except ConfigError as exc:
                raise InputError(f"{path}:{h.line}: {exc}") from exc
            if h.leaf is not None and h.leaf.isdigit() and h.leaf != of_node:
                raise InputError(
                    f"{path}:{h.line}: leaf={h.leaf} but node={h.node} is on leaf {of_node} of cluster "
                    f"{name!r}; give one of them, or fix the one that is wrong"
                )
        leaves.append(h.leaf if h.leaf is not None else of_node)
    n_leaves = int(getattr(cluster, "leaves", 1))
    per_leaf = int(getattr(cluster, "nodes_per_leaf", n_nodes))
    used: dict[str, list[Host]] = {}
    for h, leaf in zip(hosts, leaves, strict=True):
        used.setdefault(leaf, []).append(h)
    if len(used) > n_leaves:
        second = next(hs[0] for hs in used.values() if hs[0] is not hosts[0])
        what = "one switch" if n_leaves == 1 else f"{n_leaves} leaves"
        raise InputError(
            f"{path}:{second.line}: leaf={leaves[hosts.index(second)]} makes {len(used)} leaves, but "
            f"cluster {name!r} has {what}; use a cluster file with the hosts' leaf-spine topology"
        )
    for leaf, hs in used.items():
        if len(hs) > per_leaf:
            raise InputError(
                f"{path}:{hs[per_leaf].line}: {len(hs)} hosts on leaf {leaf}, but cluster {name!r} has "
                f"{per_leaf} nodes per leaf; fix leaf= or use a cluster file with nodes_per_leaf: {len(hs)}"
            )
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

    @app.command(epilog=HOSTS_SYNTAX)
    def place(
        cluster: str = typer.Option(..., "--cluster", help="cluster preset name or YAML file"),
        hosts: Path = typer.Option(
            ..., "--hosts", help="hosts file in today's rank order (Open MPI, MPICH, one name a line)"
        ),
        nbytes: str = typer.Option("1G", "--bytes", help="all-reduce size for the traffic estimate"),
        out: Path | None = typer.Option(
            None, "--out", help="write the proposed hostfile here, in the input's format (never overwrites)"
        ),
        fmt: str = typer.Option("table", "--format", help="table|json"),
        keep_tags: bool = typer.Option(
            False, "--keep-tags", help="keep leaf=/node= in the proposed hostfile after '#'"
        ),
    ) -> None:
        """Propose a rank order that keeps ring neighbours inside a leaf; print cross-leaf traffic."""
        from fabricpace.fabric import load_cluster
        from fabricpace.pacing.placement import plan_placement, ring_bytes_per_edge

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
        # A ring all-reduce runs over every rank, not every host: each edge carries 2(N-1)/N x S with N
        # the ranks, which the slots give. Without slots, as many ranks per host as the cluster has GPUs
        # per node (what torchrun --nproc-per-node=gpu starts; said in the output).
        slots = [h.slots for h in items if h.slots is not None]
        ranks = sum(slots) if len(slots) == len(items) else len(items) * cl.gpus_per_node
        per_edge = ring_bytes_per_edge(size, ranks)
        bytes_before, bytes_after = plan.edges_before * per_edge, plan.edges_after * per_edge
        # Leaves taken from line positions describe the given order as packed: nothing to improve
        # is then what the command was told, not what it found.
        from_positions = all(h.leaf is None and h.node is None for h in items)
        ordered = [items[i] for i in plan.order]
        hostfile = "".join(h.render(tags=keep_tags) + "\n" for h in ordered)
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
                        "ranks": ranks,
                        "ranks_from": "slots" if slots else "gpus_per_node",
                        "cross_leaf_edges": {"before": plan.edges_before, "after": plan.edges_after},
                        "cross_leaf_bytes": {
                            "before": bytes_before,
                            "after": bytes_after,
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
        if not slots:
            con.print(
                f"{hosts}: no process counts, so {cl.gpus_per_node} ranks per host, the cluster's "
                f"gpus_per_node ({count(ranks, 'rank')}); give slots=N (or HOST:N) if your launcher starts "
                "another number"
            )
        elif len(set(slots)) > 1:
            con.print(
                f"{hosts}: hosts run different numbers of ranks ({', '.join(map(str, sorted(set(slots))))});"
                f" the ring runs over all {count(ranks, 'rank')}"
            )
        con.print(
            f"ring edges crossing a leaf: {plan.edges_before} -> {plan.edges_after}; "
            f"cross-leaf traffic per all-reduce of {_human(size)}: "
            f"{_human(bytes_before)} -> {_human(bytes_after)}"
            + f" (ring of {count(ranks, 'rank')}: 2(N-1)/N x S per crossing)"
        )
        if not plan.improves and not from_positions:
            con.print("the current order is already optimal; keep it")
        con.print("proposed hostfile:" if out is None else f"proposed hostfile (written to {out}):")
        print(hostfile, end="")
