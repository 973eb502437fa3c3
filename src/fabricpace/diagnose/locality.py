"""Which locality attribute (node, NUMA domain, GPU, NIC, leaf) the culprit ranks share.

For each attribute, the culprits' values are looked up and we ask how well "every rank with one of
these values" reproduces the culprit set (precision = culprits / ranks carrying those values). The
answer is the coarsest attribute that explains the culprits (precision ≥ 0.8, fewest values): a whole
slow node reads "node 3", one slow rank reads "gpu" of that rank, two slow ranks on different nodes
that use the same NIC name read "nic". NUMA, GPU and NIC names are qualified by node unless the same
name across nodes explains the culprits better (a rail, a GPU model).
"""

from __future__ import annotations

from typing import Any

import polars as pl

_ATTRS = ("leaf", "node", "nic", "numa", "gpu")


def shared_locality(culprits: list[int], rank_info: pl.DataFrame, world: list[int]) -> dict[str, Any] | None:
    """The attribute and values the culprits share, with its precision; None when nothing fits."""
    if not culprits or rank_info.height == 0:
        return None
    info = rank_info.unique(subset=["rank"]).filter(pl.col("rank").is_in(world))
    cset = set(culprits)
    candidates: list[dict[str, Any]] = []
    for attr in _ATTRS:
        if attr not in info.columns or info[attr].null_count() == info.height:
            continue
        variants = [(attr, pl.col(attr).cast(pl.String))]
        if attr in ("numa", "gpu", "nic") and "node" in info.columns:
            variants.insert(
                0,
                (
                    attr,
                    pl.concat_str(
                        [pl.col("node").cast(pl.String), pl.lit(":"), pl.col(attr).cast(pl.String)]
                    ),
                ),
            )
        for name, expr in variants:
            keyed = info.select(pl.col("rank"), expr.alias("key")).drop_nulls()
            if keyed.height < info.height:
                continue
            mine = keyed.filter(pl.col("rank").is_in(list(cset)))
            values = sorted(set(mine["key"].to_list()))
            carriers = keyed.filter(pl.col("key").is_in(values))
            if not values or carriers.height == 0:
                continue
            # Shared means fewer values than culprits (one value per culprit explains nothing),
            # except for a single culprit, whose own slot is worth naming.
            if len(cset) > 1 and len(values) >= len(cset):
                continue
            precision = len(cset) / carriers.height
            # An attribute every rank shares (one leaf for all) explains nothing.
            if keyed["key"].n_unique() <= 1:
                continue
            candidates.append(
                {
                    "attribute": name,
                    "values": values,
                    "precision": round(precision, 3),
                    "ranks_with_values": carriers.height,
                }
            )
    good = [c for c in candidates if c["precision"] >= 0.8]
    if not good:
        return None
    order = {a: i for i, a in enumerate(_ATTRS)}
    # Fewest distinct values, then the largest group explained, then the coarser attribute.
    best = min(good, key=lambda c: (len(c["values"]), -c["ranks_with_values"], order[c["attribute"]]))
    vals = best["values"]
    best["values"] = [int(v) if isinstance(v, str) and v.lstrip("-").isdigit() else v for v in vals]
    return best


_NOUN = {"gpu": "GPU", "nic": "NIC", "numa": "NUMA domain", "node": "node", "leaf": "leaf"}


def slot_names(attribute: str, values: list[Any]) -> list[str]:
    """Values of ``shared_locality`` in words: node-qualified slots '1:GPU1' -> 'GPU1 on node 1',
    '0:1' -> 'GPU 1 on node 0'; plain values get the attribute's name ('NIC mlx5_0', 'node 2')."""
    noun = _NOUN.get(attribute, attribute)
    out = []
    for v in values:
        node, sep, slot = str(v).partition(":")
        if sep and attribute in ("gpu", "nic", "numa"):
            slot = slot if slot[:1].isalpha() else f"{noun} {slot}"  # 'GPU1' as it is, '1' as 'GPU 1'
            out.append(f"{slot} on node {node}")
        else:
            out.append(f"{noun} {v}")
    return out
