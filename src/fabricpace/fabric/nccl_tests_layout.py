"""How many nodes and GPUs per node an nccl-tests log ran on, where its rank lines do not say it outright.

A complete rank list (one ``#  Rank R ... on HOST device D`` line per rank) counts its hosts; that case
stays in ``nccl_tests``. This module handles the rest:

- an **abridged** list (a pasted log with ``#  ...`` for the ranks left out, a copy of a 2,000-rank log):
  the hosts in view are not all the hosts. When the device index is the GPU's index on its node (devices
  0..G-1 on every node), GPUs per node = the highest index + 1. When it is not -- every rank prints
  ``device 0`` because each rank sees only its own GPU (per-rank ``CUDA_VISIBLE_DEVICES``, as Slurm
  wrappers and ``srun --gpus-per-task=1`` set it) -- the index says nothing, and taking it would read a
  4 x 4 job as 16 nodes of 1 GPU. Then GPUs per node are the counts that fit the ranks listed when each
  node holds a block of consecutive ranks (ranks of one host on one node, ranks of different hosts on
  different nodes): one count that fits is taken; of several, the one the file name's node count (``n4``)
  or the caller's ``LayoutHint`` (``collective --gpus-per-node``, the cluster file) gives, with a note;
  else the log is refused, naming what would tell it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fabricpace._errors import ParseError


@dataclass(frozen=True, kw_only=True)
class LayoutHint:
    """GPUs per node to assume where a log cannot tell them, and where that number comes from (for the
    note that says it was assumed, e.g. "--gpus-per-node" or "cluster 'alps' (gpus_per_node)")."""

    gpus_per_node: int
    source: str


def _blocks_fit(ranks: dict[int, tuple[str, int]], per_node: int) -> bool:
    """Whether the listed ranks fit nodes of ``per_node`` consecutive ranks: one host per node, one node
    per host."""
    node_host: dict[int, str] = {}
    host_node: dict[str, int] = {}
    for rank, (host, _) in ranks.items():
        node = rank // per_node
        if node_host.setdefault(node, host) != host or host_node.setdefault(host, node) != node:
            return False
    return True


def abridged_per_node(
    p: Path,
    ranks: dict[int, tuple[str, int]],
    rank_lines: dict[int, int],
    nranks: int,
    *,
    name_nodes: int | None,
    hint: LayoutHint | None,
) -> tuple[int, str | None]:
    """GPUs per node of an abridged rank list (``ranks``: rank -> (host, device) of the ranks listed,
    ``nranks``: highest listed rank + 1) and a note when they were assumed rather than read; ``name_nodes``:
    the node count in the file name. Raises ParseError (``file:line``) when they cannot be told."""
    by_host: dict[str, list[int]] = {}
    for host, dev in ranks.values():
        by_host.setdefault(host, []).append(dev)
    per_node = max(max(devs) for devs in by_host.values()) + 1
    if per_node > 1 and all(len(set(devs)) == len(devs) for devs in by_host.values()):
        # the device index is the GPU's index on its node: GPUs per node = the highest index + 1, so the
        # last listed rank must be its node's last GPU; else the pasted list was cut short
        if nranks % per_node:
            host, dev = ranks[nranks - 1]
            raise ParseError(
                f"{p}:{rank_lines[nranks - 1]}: the rank list stops at rank {nranks - 1}, device {dev} of "
                f"host {host}, where hosts run devices 0..{per_node - 1}: it was cut, so the node count is "
                "unknown; give the complete log (every '#  Rank' line)"
            )
        return per_node, None
    # every rank prints device 0 (or a host repeats an index): each rank sees only its own GPU, so the
    # indices do not count GPUs per node; the counts that fit the listed ranks in blocks per node do
    fits = [g for g in range(1, nranks + 1) if nranks % g == 0 and _blocks_fit(ranks, g)]
    shown = "are all 0" if per_node == 1 else "repeat on one host"
    why = (
        f"the rank list is abridged and its device indices {shown} (per-rank CUDA_VISIBLE_DEVICES), so they "
        "do not count GPUs per node"
    )
    if len(fits) == 1:
        return fits[0], None
    if name_nodes and nranks % name_nodes == 0 and nranks // name_nodes in fits:
        g = nranks // name_nodes
        return g, f"{why}: {g} GPUs per node from the file name's {name_nodes} nodes ({nranks} ranks)"
    if hint is not None and hint.gpus_per_node in fits:
        g = hint.gpus_per_node
        return g, f"{why}: {g} GPUs per node from {hint.source}, so {nranks // g} nodes"
    gap = min(r for r in range(nranks) if r not in ranks)
    at = rank_lines[gap - 1] if gap else min(rank_lines.values())
    if fits:
        told = " or ".join(str(g) for g in fits[:6]) + (" or more" if len(fits) > 6 else "")
        given = (
            f" ({hint.gpus_per_node} from {hint.source} does not fit)" if hint is not None else ""
        )  # fmt: skip
        what = f"{told} GPUs per node fit the {len(ranks)} ranks listed{given}"
    else:
        what = "no count of GPUs per node fits the ranks listed in blocks per node"
    raise ParseError(
        f"{p}:{at}: {why}: {what}; give the complete log (every '#  Rank' line), GPUs per node "
        "(collective --gpus-per-node, or --cluster FILE of the machine it ran on) or the node count in the "
        "file name (n4_all_reduce.log)"
    )
