"""topology_contention: collectives take longer in the network than the fabric delivers when quiet,
and that extra time sits on groups that cross a leaf/spine, or in periods (foreign traffic).

Transfer of one instance = ``min_r t_exit − max_r t_enter`` (the part no rank could avoid). Baseline:

* with a cluster (``--cluster``): the fabric model's time for that op, size and node count
  (``fabricpace.fabric.collective_time``);
* else the run's own *quiet baseline*: the ``contention_baseline_quantile`` of the transfer times of
  all instances of the same shape (op, bytes, group size, nodes spanned) — the best the fabric gave.

An instance is inflated at ≥ ``contention_min_inflation`` × baseline; its excess is the time above the
baseline. Per step, the exposed excess is the largest per-group sum, capped by the step's exposed
communication (step time minus the slowest rank's own work). A finding needs that to reach
``contention_min_share`` of step time *and* to be concentrated: ≥ ``contention_concentration`` of the
excess on cross-leaf groups while same-shape intra-leaf groups stay quiet, or inflated steps clustered
in time (runs test z ≤ ``contention_runs_z``). Against a fabric model, uniform inflation also counts,
unless a persistent straggler sits in the inflated groups (a slow rank slows a CPU-reduced ring itself).
Spread-out, unclustered jitter is not contention (it is noise, or sync amplification). The fabric model
prices each group in its own rank order; a rank order that crosses leaves more often than it must is
said whatever the verdict (``placement_note``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from fabricpace.diagnose import one_off
from fabricpace.diagnose.config import DiagnoseConfig
from fabricpace.diagnose.findings import Culprits, Finding
from fabricpace.diagnose.metrics import RunMetrics
from fabricpace.diagnose.persistent_straggler import culprit_nodes
from fabricpace.diagnose.stats import block_bootstrap, runs_test_z

_OPS = (
    ("all_reduce", r"(?i)all[-_]?reduce"),
    ("all_gather", r"(?i)all[-_]?gather"),
    ("reduce_scatter", r"(?i)reduce[-_]?scatter"),
    ("all_to_all", r"(?i)all[-_]?to[-_]?all"),
    ("broadcast", r"(?i)broadcast"),
)


def _f(value: Any, default: float = 0.0) -> float:
    """A polars scalar (possibly None) as float."""
    return float(value) if isinstance(value, int | float) else default


def _groups(m: RunMetrics) -> pl.DataFrame:
    """group -> size, nodes spanned, leaves spanned, ranks per node, member ranks."""
    members = (
        m.members
        if m.members is not None
        else m.run.collectives.select(pl.col("group").fill_null("world"), "rank").unique()
    )
    info = m.rank_info.select("rank", "node", "leaf").unique(subset=["rank"]) if m.rank_info.height else None
    if info is not None:
        members = members.join(info, on="rank", how="left")
    else:
        members = members.with_columns(
            pl.lit(None, pl.Int32).alias("node"), pl.lit(None, pl.Int32).alias("leaf")
        )
    per_node = members.group_by(["group", "node"]).len()
    gpn = per_node.group_by("group").agg(pl.col("len").max().alias("gpus_per_node"))
    g = members.group_by("group").agg(
        pl.col("rank").n_unique().alias("size"),
        pl.col("node").drop_nulls().n_unique().alias("n_nodes"),
        pl.col("leaf").drop_nulls().n_unique().alias("n_leaves"),
        pl.col("leaf").drop_nulls().unique().sort().alias("leaves"),
        pl.col("rank").unique().sort().alias("members"),
    )
    g = g.join(gpn, on="group", how="left").with_columns(pl.col("n_nodes").clip(lower_bound=1))
    return g.join(_node_orders(members), on="group", how="left")


def _node_orders(members: pl.DataFrame) -> pl.DataFrame:
    """group -> ``node_order``, ``node_leaves``: the group's nodes in rank order, as model node ids
    ("0,2,1,3"; null where that order is the packed one), and the leaf of each model node ("0,0,1,1"),
    for the fabric model (``collective_time(node_order=…, node_leaves=…)``: NCCL's and gloo's rings follow
    rank order); both null where a leaf is unknown. Model ids number the group's nodes by (leaf, node),
    so nodes of one leaf are neighbours in the model as in the run. The model priced every run in the
    packed order: an interleaved lab run's quiet transfers (47.6 ms, 4 leaf crossings) then read ×1.85
    against 25.9 ms (audit 17 A4); and it packed the nodes into the cluster's leaves, so a healthy job
    the scheduler spread 2 + 2 over two leaves of 4 was priced as one leaf and read as contention."""
    orders: dict[str, str | None] = {}
    leaves: dict[str, str | None] = {}
    cols = members.select("group", "rank", "node", "leaf").sort("group", "rank")
    for (group,), part in cols.group_by(["group"], maintain_order=True):
        node, leaf = part["node"].to_list(), part["leaf"].to_list()
        if any(v is None for v in node) or any(v is None for v in leaf):
            orders[str(group)] = leaves[str(group)] = None
            continue
        visits = list(dict.fromkeys(int(v) for v in node))  # first visit of each node in rank order
        leaf_of = {int(n): int(lf) for n, lf in zip(node, leaf, strict=True)}
        by_leaf = sorted(visits, key=lambda n: (leaf_of[n], n))
        pos = {n: i for i, n in enumerate(by_leaf)}
        order = [pos[n] for n in visits]
        orders[str(group)] = None if order == sorted(order) else ",".join(map(str, order))
        leaves[str(group)] = ",".join(str(leaf_of[n]) for n in by_leaf)
    return pl.DataFrame(
        {"group": list(orders), "node_order": list(orders.values()), "node_leaves": list(leaves.values())},
        schema={"group": members.schema["group"], "node_order": pl.String, "node_leaves": pl.String},
    )


def _model_baseline(inst: pl.DataFrame, cluster: Any, notes: list[str]) -> pl.DataFrame | None:
    try:
        from fabricpace.fabric import collective_time
    except ImportError:
        notes.append("fabric model not available; using the run's quiet baseline")
        return None
    op_norm = pl.lit(None, pl.String)
    for name, pat in reversed(_OPS):
        op_norm = (
            pl.when(pl.col("op").cast(pl.String).str.contains(pat)).then(pl.lit(name)).otherwise(op_norm)
        )
    keyed = inst.with_columns(
        op_norm.alias("op_norm"), pl.col("node_order").fill_null(""), pl.col("node_leaves").fill_null("")
    )
    on = ["op_norm", "bytes", "n_nodes", "gpus_per_node", "node_order", "node_leaves"]
    keys = keyed.select(on).unique().drop_nulls()
    expected: list[float | None] = []
    for op, nbytes, nodes, gpn, order, leaves in keys.iter_rows():
        # Priced in the run's own rank order and on its own leaves: the placement is the run's, not the
        # fabric's fault, and ring_leaf_crossings (a note, or the finding's evidence) names it separately.
        node_order = [int(v) for v in order.split(",")] if order else None
        node_leaves = [int(v) for v in leaves.split(",")] if leaves else None
        if node_leaves is not None and len(node_leaves) != int(nodes):
            node_leaves = None  # a group spanning nodes the member table does not cover: packed
        try:
            res = collective_time(
                cluster, op, int(max(nbytes, 1)), nodes=int(nodes), gpus_per_node=int(gpn),
                node_order=node_order, node_leaves=node_leaves,
            )
            expected.append(res.time_s * 1e9)
        except Exception as exc:  # a shape the model cannot price keeps the quiet baseline
            notes.append(f"fabric model cannot price {op} {nbytes} B on {nodes} nodes ({exc})")
            expected.append(None)
    keys = keys.with_columns(pl.Series("base_ns", expected, dtype=pl.Float64))
    return keyed.join(keys, on=on, how="left")


def detect(
    m: RunMetrics, cfg: DiagnoseConfig, cluster: Any = None, stragglers: dict[int, str] | None = None
) -> tuple[list[Finding], dict[str, Any], str | None]:
    """(findings, metrics, abstention reason or None). ``stragglers``: rank -> cause of the ranks the
    persistent_straggler finding names (the engine runs it first): a transfer excess that is only uniform
    against the fabric model, in a group such a rank belongs to, is not claimed as contention.

    Whatever is found, a rank order that makes a ring cross leaves more often than it must is said:
    in the finding's evidence when there is one, else as a note (``metrics.ring_leaf_crossings`` and
    ``metrics.notes``) — it needs no baseline, only ranks.parquet's leaves."""
    found, metrics, why = _detect(m, cfg, cluster, stragglers or {})
    if not any("ring_leaf_crossings" in f.evidence for f in found):
        order = placement_note(m, cluster)
        if order is not None:
            metrics["ring_leaf_crossings"] = order
            m.notes.append(order["note"])
    return found, metrics, why


def _detect(
    m: RunMetrics, cfg: DiagnoseConfig, cluster: Any, stragglers: dict[int, str]
) -> tuple[list[Finding], dict[str, Any], str | None]:
    if m.instances is None:
        return [], {}, "no collectives recorded: transfer times unknown"
    groups = _groups(m)
    inst = m.instances.filter((pl.col("n") >= 2) & pl.col("step").is_in(m.steps.tolist())).join(
        groups.select("group", "size", "n_nodes", "n_leaves", "gpus_per_node", "node_order", "node_leaves"),
        on="group",
        how="left",
    )
    if inst.height == 0:
        return [], {}, "no collective instances with two or more ranks"
    # Transfer is defined only where every rank saw the collective complete. DDP's grad_hooks mode
    # records each bucket's hand-over but only the backward's last bucket completing: the other
    # buckets' rows are arrival markers (t_exit = t_enter, transfer 0). Counted, a last bucket with
    # the same size as the markers (repeated identical layers) got a quiet baseline of 0, and every
    # instance was then dropped: "too few instances … (need 10)" on a run with 199 real transfers.
    markers = int((inst["min_stay"] <= 0).sum()) if "min_stay" in inst.columns else 0
    if markers:
        inst = inst.filter(pl.col("min_stay") > 0)
        if inst.height == 0:
            return [], {"arrival_marker_instances": markers}, (
                f"no collective completions recorded, only arrival markers ({markers} instances: DDP's "
                "grad_hooks mode records when each bucket is handed over, and a completion only for the "
                "backward's last bucket): transfer times unknown"
            )
    notes: list[str] = []
    basis = "quiet baseline"
    with_model = _model_baseline(inst, cluster, notes) if cluster is not None else None
    shape = ["op", "bytes", "size", "n_nodes"]
    # Imports may lack sizes (What-if traces): unknown is one shape, not "no shape" (null keys never join).
    inst = inst.with_columns(
        pl.col("op").cast(pl.String).fill_null(""), *(pl.col(c).fill_null(-1) for c in shape[1:])
    )
    quiet = inst.group_by(shape).agg(
        pl.col("transfer_ns").quantile(cfg.contention_baseline_quantile).alias("quiet_ns"),
        pl.len().alias("shape_n"),
    )
    inst = inst.join(quiet, on=shape, how="left")
    if with_model is not None and with_model["base_ns"].null_count() < with_model.height:
        inst = inst.join(with_model.select("group", "seq", "base_ns"), on=["group", "seq"], how="left")
        inst = inst.with_columns(pl.coalesce("base_ns", pl.when(pl.col("shape_n") >= 10).then("quiet_ns")))
        basis = "fabric model"
    else:
        inst = inst.with_columns(pl.when(pl.col("shape_n") >= 10).then(pl.col("quiet_ns")).alias("base_ns"))
    judged = inst.filter(pl.col("base_ns").is_not_null() & (pl.col("base_ns") > 0)).with_columns(
        (pl.col("transfer_ns") / pl.col("base_ns")).alias("inflation")
    )
    if judged.height == 0:
        seen = f"{inst.height} {'instance' if inst.height == 1 else 'instances'} with a completion"
        if markers:
            seen += f" ({markers} arrival markers of DDP's grad_hooks mode left out)"
        if int(_f(inst["shape_n"].max())) < 10:
            why = (
                f"too few instances of each collective shape for a quiet baseline (need 10; {seen}, "
                f"at most {int(_f(inst['shape_n'].max()))} of one shape)"
            )
        else:
            why = (
                f"no quiet baseline above 0 ns ({seen}: their transfer — first exit after the last "
                "arrival — is 0 in the quietest 10%)"
            )
        return [], {"arrival_marker_instances": markers} if markers else {}, why
    inst = judged
    inst = inst.with_columns(
        pl.when(pl.col("inflation") >= cfg.contention_min_inflation)
        .then(pl.col("transfer_ns") - pl.col("base_ns"))
        .otherwise(0.0)
        .alias("excess_ns"),
        (pl.col("n_leaves") > 1).alias("cross_leaf"),
    )
    per_group_step = inst.group_by(["step", "group"]).agg(pl.col("excess_ns").sum())
    per_step = per_group_step.group_by("step").agg(pl.col("excess_ns").max())
    excess = np.zeros(m.n_steps)
    si = np.searchsorted(m.steps, per_step["step"].to_numpy())
    excess[si] = per_step["excess_ns"].to_numpy()
    if m.work is not None:
        with np.errstate(all="ignore"):
            exposed = np.clip(np.nan_to_num(m.step_time - np.nanmax(m.work, axis=0)), 0, None)
        loss = np.minimum(excess, exposed)
    else:
        loss = excess
    total = float(np.nansum(m.step_time))
    share = float(loss.sum() / total) if total > 0 else 0.0
    med_infl = _f(inst["inflation"].median())
    metrics: dict[str, Any] = {
        "transfer_excess_share_of_step": share,
        "transfer_inflation_median": med_infl,
        "transfer_baseline": basis,
    }
    if markers:
        metrics["arrival_marker_instances"] = markers
    # Where the excess sits: cross-leaf groups vs same-shape intra-leaf ones, and periods in time.
    ex_total = float(inst["excess_ns"].sum()) or 1.0
    cross_share = float(inst.filter(pl.col("cross_leaf"))["excess_ns"].sum()) / ex_total
    has_both = inst["cross_leaf"].n_unique() == 2
    intra_infl = inst.filter(~pl.col("cross_leaf"))["inflation"].median() if has_both else None
    cross_infl = inst.filter(pl.col("cross_leaf"))["inflation"].median() if has_both else None
    on_cross = bool(
        has_both
        and cross_share >= cfg.contention_concentration
        and _f(cross_infl) >= cfg.contention_min_inflation * 0.8 * max(_f(intra_infl, 1.0), 1.0)
    )
    # An inflated step loses at least the mode's threshold share of its own time to excess transfer.
    flags = loss >= cfg.contention_min_share * np.nan_to_num(m.step_time)
    runs_z = runs_test_z(flags)
    periods = _periods(m.steps, flags, loss, np.nan_to_num(m.step_time))
    in_periods = float(loss[flags].sum() / max(loss.sum(), 1.0))
    in_time = bool(
        runs_z <= cfg.contention_runs_z
        and 0.02 <= flags.mean() <= 0.9
        and flags.sum() >= cfg.contention_min_period_steps
        and in_periods >= 0.7
    )
    # Foreign traffic for part of a run: judged by the loss inside its periods (the whole-run share
    # stays the severity, so a short burst reads as a small cost, but it is still named).
    period_share = (
        float(loss[flags].sum() / max(float(np.nansum(m.step_time[flags])), 1.0)) if in_time else 0.0
    )
    uniform_vs_model = basis == "fabric model" and med_infl >= cfg.contention_min_inflation
    metrics.update(
        {"cross_leaf_excess_share": cross_share, "period_runs_z": runs_z, "period_excess_share": period_share}
    )
    if max(share, period_share) < cfg.contention_min_share:
        return [], metrics, None
    if not (on_cross or in_time or uniform_vs_model):
        # Decided — spread-out transfer jitter is not contention — but a large excess with no finding
        # and no word read as an oversight (an audit's healthy 2-rank run: 57%, ×7.08): say why.
        metrics["transfer_excess_note"] = _why_not(
            m,
            inst,
            cfg,
            share=share,
            med_infl=med_infl,
            cross_share=cross_share,
            has_both=has_both,
            cross_infl=cross_infl,
            intra_infl=intra_infl,
            runs_z=runs_z,
            flags=flags,
            in_periods=in_periods,
            basis=basis,
            cluster=cluster,
        )
        return [], metrics, None

    hot_groups = (
        inst.group_by("group")
        .agg(pl.col("excess_ns").sum(), pl.col("inflation").median())
        .filter(pl.col("excess_ns") > 0)
        .sort("excess_ns", descending=True)
    )
    hot = groups.join(hot_groups.select("group", "excess_ns", "inflation"), on="group", how="inner").sort(
        "excess_ns", descending=True
    )
    if not (on_cross or in_time) and stragglers:
        why_strag = _straggler_explains(hot, stragglers, med_infl)
        if why_strag is not None:
            metrics["transfer_excess_note"] = why_strag
            return [], metrics, why_strag

    conf, ci = block_bootstrap(loss, m.step_time, cfg.contention_min_share, cfg)
    if in_time and share < cfg.contention_min_share:  # confidence of the in-period loss instead
        conf, _ = block_bootstrap(loss[flags], m.step_time[flags], cfg.contention_min_share, cfg)
    links, spans = _links(hot, on_cross)
    member_sets = hot["members"].to_list()
    ranks = sorted({int(r) for ms in member_sets for r in ms}) if member_sets else []
    if len(ranks) * 2 > m.n_ranks:  # the whole job shares the problem: naming every rank says nothing
        ranks = []
    where = []
    if on_cross:
        where.append(f"{cross_share:.0%} of the excess on cross-leaf groups")
    if in_time:
        where.append(f"inflated in {len(periods)} {'period' if len(periods) == 1 else 'periods'} of steps")
    if uniform_vs_model and not where:
        where.append("everywhere, against the fabric model")
    evidence = dict(metrics)
    n_steps = max(m.n_steps, 1)
    evidence.update(
        {
            "concentrated": "; ".join(where),
            "cross_leaf_inflation_median": cross_infl,
            "intra_leaf_inflation_median": intra_infl,
            "periods": periods[:5],
            "inflated_step_share": float(flags.mean()),
            # excess_ms: the group's excess summed over the run; per step: over the steps used
            "hot_groups": [
                {"group": g, "excess_ms_per_step": e / 1e6 / n_steps, "inflation": i, "excess_ms": e / 1e6}
                for g, e, i in hot_groups.head(5).select("group", "excess_ns", "inflation").iter_rows()
            ],
            "steps": m.n_steps,
            "notes": notes,
        }
    )
    if spans:
        evidence["links_unknown"] = _links_unknown(spans, cluster)
    order = _rank_order_crossings(m, hot.filter(pl.col("n_leaves") > 1))
    if order is not None:
        evidence["ring_leaf_crossings"] = order
    hosts = m.rank_info["host"].n_unique() if m.rank_info.height and "host" in m.rank_info.columns else 0
    if hosts == 1:  # no network between the ranks: the path is loopback / shared memory / NVLink
        evidence["scope"] = (
            "single host: transfers stay inside one machine, so the inflation is host contention"
        )
        rec = (
            "All ranks share one host: collective transfers slowed down in the named periods, which points "
            "at other processes competing for the host's CPU/memory/PCIe (or NVLink), not at a network. "
            "Find what ran then; pin training to dedicated cores."
        )
    else:
        evidence["scope"] = "network"
        rec = (
            "Transfers are inflated by fabric contention: keep ring neighbours inside a leaf (fabricpace "
            "place), pace/space DDP bucket launches (fabricpace pacing 'comm'), check leaf uplink "
            "oversubscription and ECMP hashing (path pinning / QP-aware hashing)"
        )
        rec += ", and find the foreign jobs sharing those links in the named periods." if in_time else "."
        if order is not None:
            rec = (
                f"The ranks' node order makes a ring cross leaves {order['crossings']} times where "
                f"{order['minimum']} would do (NCCL's rings follow rank order): relaunch with a leaf-grouped "
                "hostfile (fabricpace place --cluster FILE --hosts FILE). " + rec
            )
    f = Finding(
        mode="topology_contention",
        run=m.path,
        severity_pct=100 * share,
        severity_ci_pct=(100 * ci[0], 100 * ci[1]),
        confidence=conf if (on_cross or in_time) else 0.5 * conf,
        culprits=Culprits(ranks=ranks, nodes=culprit_nodes(m, ranks) if ranks else [], links=links),
        evidence=evidence,
        what_if_saving_pct=100 * share,
        recommendation=rec,
    )
    one_off.annotate(f, m, loss, cfg.contention_min_share, cfg)
    return [f], metrics, None


def _straggler_explains(hot: pl.DataFrame, stragglers: dict[int, str], med_infl: float) -> str | None:
    """Why a transfer excess that is only uniform against the fabric model (not on cross-leaf groups,
    not in periods) is not named topology_contention, when a persistent straggler sits in the inflated
    groups; None when none does. A rank slower at its own work slows the transfer itself where the
    reduction runs on the CPU (gloo) or shares its host: the lab's throttled-rank run (rank 1 at 0.03
    CPU, 200 Mbit/s uplinks measured healthy at 22.5 ms per all-reduce) read "topology_contention
    29.5%, link leaf0<->leaf1, transfer ×3.44 vs fabric model" above the straggler itself, and a user
    would have re-cabled a healthy link (audit 17 A4). A slow link shows instead on the groups that
    cross it (beside quiet intra-leaf ones) or in periods; uniform excess beside a named slow rank
    cannot be told from that rank's doing."""
    members = {int(r) for ms in hot["members"].to_list() for r in ms}
    inside = sorted(r for r in stragglers if r in members)
    if not inside:
        return None
    cause = stragglers[inside[0]]
    who = f"{'ranks' if len(inside) > 1 else 'rank'} {', '.join(map(str, inside))}"
    return (
        f"transfers are ×{med_infl:.2f} the fabric model's time everywhere (not on cross-leaf groups "
        f"alone, not in periods), in groups where persistent_straggler names {who} ({cause}): a slow rank "
        "slows the ring itself where the reduction runs on the CPU (gloo) or competes with its host, so "
        "this excess cannot be told from the straggler's doing and no link is named; fix the straggler "
        "first, then judge the transfers again"
    )


def placement_note(m: RunMetrics, cluster: Any = None) -> dict[str, Any] | None:
    """The ring-order check on its own: the largest cross-leaf group's leaf crossings in rank order
    when more than the minimum, with a note (and, with a cluster, what the fabric model prices the
    order at against the leaf-grouped one). Run whatever the contention verdict: an interleaved lab run
    83% slower than its contiguous twin read "healthy" with no word, although ranks.parquet showed its
    ring crossing leaves 4 times where 2 would do (audit 17 A4)."""
    if not m.rank_info.height or not {"rank", "node", "leaf"} <= set(m.rank_info.columns):
        return None
    groups = _groups(m).filter(pl.col("n_leaves") > 1)
    if groups.height == 0:
        return None
    if m.instances is not None:  # the busiest of the largest groups: the ring that carries the job
        counts = m.instances.group_by("group").agg(pl.len().alias("count"))
        groups = groups.join(counts, on="group", how="left").with_columns(pl.col("count").fill_null(0))
    else:
        groups = groups.with_columns(pl.lit(0).alias("count"))
    order = _rank_order_crossings(m, groups.sort(["size", "count"], descending=True))
    if order is None:
        return None
    times = _price_orders(m, groups.filter(pl.col("group") == order["group"]), cluster)
    note = (
        f"rank order: group {order['group']}'s ring crosses leaves {order['crossings']} times where "
        f"{order['minimum']} would do ({order['nodes']} nodes in rank order), so each of its ring "
        f"collectives carries {order['crossings'] / order['minimum']:.1f}× the cross-leaf traffic of a "
        "leaf-grouped order (NCCL's and gloo's rings follow rank order)"
    )
    if times is not None:
        order.update(times)
        note += (
            f"; the fabric model prices its {times['op']} of {times['bytes']} B at "
            f"{times['model_ms']:.1f} ms in this order vs {times['model_packed_ms']:.1f} ms leaf-grouped"
        )
        if times.get("share_of_step") is not None:
            note += (
                f": {times['extra_ms_per_step']:.1f} ms more transfer per step, {times['share_of_step']:.0%} "
                "of the step time where compute does not hide it"
            )
    own = _own_files(m)
    if times is None and "file" in own:
        note += f"; not priced without --cluster ({own['file']} describes this run's fabric)"
    elif times is None:
        note += "; no cluster file (--cluster), so its cost is not priced"
    cl_file, hosts = own.get("file", "FILE"), own.get("hosts", "FILE")
    note += f". Relaunch with a leaf-grouped hostfile: fabricpace place --cluster {cl_file} --hosts {hosts}"
    if m.run.manifest.source == "lab" and "hosts" in own:  # the lab replays place's proposal
        note += " (a lab run replays its proposal: fabricpace lab run --placement PROPOSED_HOSTS)"
    order["note"] = note
    return order


def _own_files(m: RunMetrics) -> dict[str, str]:
    """The cluster and hosts files the run directory carries (a lab run writes lab/cluster.yaml and
    lab/hosts.txt and names them in manifest.cluster), as paths; empty when it has none."""
    cl = m.run.manifest.cluster
    if not isinstance(cl, dict):
        return {}
    out = {}
    for key in ("file", "hosts"):
        rel = cl.get(key)
        if isinstance(rel, str) and rel and (Path(m.path) / rel).is_file():
            out[key] = str(Path(m.path) / rel)
    return out


def _price_orders(m: RunMetrics, group: pl.DataFrame, cluster: Any) -> dict[str, Any] | None:
    """The fabric model's time of the group's commonest collective in its rank order and leaf-grouped,
    and the difference times that collective's count per step as a share of the mean step."""
    if cluster is None or m.instances is None or group.height == 0 or not group["node_order"][0]:
        return None
    g = group.row(0, named=True)
    inst = m.instances.filter((pl.col("group") == g["group"]) & pl.col("bytes").is_not_null())
    if inst.height == 0:
        return None
    op, nbytes, count = (
        inst.group_by(pl.col("op").cast(pl.String), "bytes").len().sort("len", descending=True).row(0)
    )
    name = next((n for n, pat in _OPS if re.search(pat, op or "")), None)
    if name is None:
        return None
    try:
        from fabricpace.fabric import collective_time

        kw: dict[str, Any] = {"nodes": int(g["n_nodes"]), "gpus_per_node": int(g["gpus_per_node"] or 1)}
        leaves = [int(v) for v in str(g.get("node_leaves") or "").split(",") if v]
        if len(leaves) == kw["nodes"]:  # both orders on the run's own leaves
            kw["node_leaves"] = leaves
        order = [int(v) for v in str(g["node_order"]).split(",")]
        t = collective_time(cluster, name, int(nbytes), node_order=order, **kw).time_s
        t0 = collective_time(cluster, name, int(nbytes), **kw).time_s
    except Exception:  # a shape the model cannot price: the note stays structural
        return None
    per_step = count / max(inst["step"].n_unique(), 1)
    mean = m.mean_step_ns
    share = (t - t0) * 1e9 * per_step / mean if mean > 0 else None
    return {
        "extra_ms_per_step": (t - t0) * 1e3 * per_step,
        "op": name,
        "bytes": int(nbytes),
        "model_ms": t * 1e3,
        "model_packed_ms": t0 * 1e3,
        "share_of_step": share,
    }


def _rank_order_crossings(m: RunMetrics, cross: pl.DataFrame) -> dict[str, Any] | None:
    """Leaf changes along the first group's rank order of ``cross`` (cross-leaf groups, hottest or
    largest first; NCCL builds rings in rank order), when it is more than the minimum (one per leaf):
    evidence that the hostfile is not sorted by leaf."""
    if not m.rank_info.height or not {"rank", "node", "leaf"} <= set(m.rank_info.columns):
        return None
    if cross.height == 0:
        return None
    hottest = cross.row(0, named=True)
    group, members = hottest["group"], hottest["members"]
    info = (
        m.rank_info.select("rank", "node", "leaf")
        .unique(subset=["rank"])
        .filter(pl.col("rank").is_in(list(members)) & pl.col("leaf").is_not_null())
        .sort("rank")
    )
    node, leaf = info["node"].to_numpy(), info["leaf"].to_numpy()
    if node.size < 2:
        return None
    keep = np.concatenate([[True], node[1:] != node[:-1]])  # one entry per node visit in rank order
    seq = leaf[keep]
    crossings = int(np.count_nonzero(seq != np.roll(seq, -1)))
    used = int(np.unique(seq).size)
    minimum = used if used > 1 else 0
    if crossings <= minimum:
        return None
    return {"group": group, "crossings": crossings, "minimum": minimum, "nodes": int(seq.size)}


def _periods(
    steps: np.ndarray, flags: np.ndarray, loss: np.ndarray, step_time: np.ndarray
) -> list[dict[str, Any]]:
    """Contiguous runs of inflated steps (gaps of ≤ 2 steps bridged), largest excess first. Each with
    its excess per step and as a share of its steps' time; ``excess_ms`` is the sum over the period
    (an audit read "steps 51–101, excess 3384.22 ms" as per step: it was 51 steps' worth)."""
    idx = np.flatnonzero(flags)
    if idx.size == 0:
        return []
    cut = np.flatnonzero(np.diff(idx) > 3) + 1
    out = []
    for seg in np.split(idx, cut):
        part = slice(seg[0], seg[-1] + 1)
        total = float(loss[part].sum())
        n = seg[-1] + 1 - seg[0]
        out.append(
            {
                "first_step": int(steps[seg[0]]),
                "last_step": int(steps[seg[-1]]),
                "steps": int(n),
                "excess_ms_per_step": total / n / 1e6,
                "excess_share_of_period": total / max(float(np.nansum(step_time[part])), 1.0),
                "excess_ms": total / 1e6,
            }
        )
    return sorted(out, key=lambda p: -p["excess_ms"])


def _links(hot: pl.DataFrame, on_cross: bool) -> tuple[list[str], list[tuple[str, list[int]]]]:
    """(links, hot cross-leaf groups no link can be named for, with their leaves). Links: the leaf
    uplinks every hot cross-leaf group uses, else the leaf pairs of hot groups that span two leaves. A
    group that spans more leaves crosses all their uplinks, so its transfers single out none: the
    audit's 16-leaf job read "culprit link leaf0<->leaf1<->…<->leaf15", the whole fabric."""
    rows = [
        (g, [int(x) for x in ls], e)
        for g, ls, e, n in hot.select("group", "leaves", "excess_ns", "n_leaves").iter_rows()
        if n and n > 1
    ]
    if not rows:
        return [], []
    total = sum(e for _, _, e in rows) or 1.0
    leaves = sorted({x for _, ls, _ in rows for x in ls})
    common = [lf for lf in leaves if sum(e for _, ls, e in rows if lf in ls) / total >= 0.9]
    if on_cross and common and len(common) < len(leaves):
        return [f"leaf{lf}-spine" for lf in common], []
    pairs: list[str] = []
    spans: list[tuple[str, list[int]]] = []
    for g, ls, _ in rows[:5]:
        if len(ls) > 2:
            spans.append((str(g), ls))
            continue
        name = "<->".join(f"leaf{x}" for x in ls)
        if name not in pairs:
            pairs.append(name)
    return pairs, spans


def _leaf_range(ls: list[int]) -> str:
    if ls == list(range(ls[0], ls[-1] + 1)):
        return f"leaf{ls[0]}–leaf{ls[-1]}"
    return ", ".join(f"leaf{x}" for x in ls)


def _links_unknown(spans: list[tuple[str, list[int]]], cluster: Any) -> str:
    """Why no link is named for hot groups that span more than two leaves."""
    what = "; ".join(f"group {g} spans {len(ls)} leaves ({_leaf_range(ls)})" for g, ls in spans)
    out = f"{what}: its transfers cross all their uplinks, so no single link can be named"
    if cluster is None:
        out += "; no cluster file (--cluster): excess measured against this run's quietest transfers"
    return out


def _why_not(
    m: RunMetrics,
    inst: pl.DataFrame,
    cfg: DiagnoseConfig,
    *,
    share: float,
    med_infl: float,
    cross_share: float,
    has_both: bool,
    cross_infl: Any,
    intra_infl: Any,
    runs_z: float,
    flags: np.ndarray,
    in_periods: float,
    basis: str,
    cluster: Any,
) -> str:
    """Why a transfer excess of at least ``contention_min_share`` is not named topology_contention:
    which of the concentration conditions fail (docs/diagnosis.md)."""
    why: list[str] = []
    leaves = inst["n_leaves"].drop_nulls()
    hosts = m.rank_info["host"].n_unique() if m.rank_info.height and "host" in m.rank_info.columns else 0
    if hosts == 1:
        why.append("all ranks on one host, so no group crosses a leaf")
    elif leaves.len() == 0 or int(_f(leaves.max())) == 0:
        why.append("no leaf recorded for the ranks (ranks.parquet leaf), so no group is known to cross one")
    elif not has_both and bool(inst["cross_leaf"].all()):
        why.append("every group crosses leaves, with no same-shape intra-leaf group to compare")
    elif not has_both:
        why.append("no group crosses a leaf")
    elif cross_share < cfg.contention_concentration:
        why.append(
            f"{cross_share:.0%} of the excess on cross-leaf groups (≥ {cfg.contention_concentration:.0%} "
            "needed)"
        )
    else:
        why.append(
            f"cross-leaf transfers inflated ×{_f(cross_infl):.2f}, hardly more than intra-leaf ones "
            f"(×{_f(intra_infl):.2f})"
        )
    inflated = float(flags.mean()) if flags.size else 0.0
    if inflated > 0.9:
        why.append(f"inflated in nearly every step ({inflated:.0%}), not in periods")
    elif int(flags.sum()) < max(cfg.contention_min_period_steps, 1) or inflated < 0.02:
        why.append(f"too few inflated steps for a period ({int(flags.sum())})")
    elif runs_z > cfg.contention_runs_z:
        why.append(
            f"inflated steps ({inflated:.0%}) not clustered in time (runs-test z {runs_z:.1f}, "
            f"≤ {cfg.contention_runs_z:.0f} needed)"
        )
    else:
        why.append(f"only {in_periods:.0%} of the excess in its inflated steps (70% needed for periods)")
    if cluster is None:
        why.append("no cluster file (--cluster) to judge transfers against the fabric model")
    elif basis != "fabric model":
        why.append("the fabric model of the cluster file could not price these collectives")
    else:
        why.append(
            f"median inflation ×{med_infl:.2f} against the fabric model (×{cfg.contention_min_inflation:.1f} "
            "needed)"
        )
    base = "fabric-model time" if basis == "fabric model" else "quiet baseline"
    where = (
        "on one host that is other processes competing for it (or the ranks' own noise), not a network"
        if hosts == 1
        else "that is noise, or sync amplification, not fabric contention"
    )
    return (
        f"transfer excess {share:.1%} of step time (median ×{med_infl:.2f} its {base}) is not "
        f"named topology_contention: it is not concentrated — {'; '.join(why)}. Spread-out transfer "
        f"jitter is not contention: {where}"
    )
