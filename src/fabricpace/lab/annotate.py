"""After a lab run: its topology into ``ranks.parquet`` and the manifest, its fault timeline into
``lab/lab.json``, the lab as a cluster file and a hosts file (lab/mirror.py), and each uplink change
placed on the run's steps. The launcher calls :func:`annotate` once the ranks are done.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Any

from fabricpace.lab import mirror
from fabricpace.lab.config import LabConfig, format_rate
from fabricpace.lab.scenario import Scenario


def place_changes(out: Path, events: list[dict[str, Any]], t0: int | None) -> None:
    """Put each applied uplink change on the run's steps: ``t_ns`` on the aligned timeline, the first
    step that ended after it (``first_step``: it ran at least partly under the new rate; None when no
    step did) and the run's ``last_step``. The report says which steps a change covered from these."""
    import polars as pl

    from fabricpace.run import load_run

    changes = [e for e in events if e.get("event") == "uplink_change" and "monotonic_ns" in e]
    if not changes or t0 is None:
        return
    try:
        steps = load_run(out, tables=("steps",), all_steps=True).steps
    except Exception:  # an unreadable run directory: the change keeps its clock reading only
        return
    if steps.height == 0:
        return
    last = int(steps["step"].max())  # type: ignore[arg-type]
    for e in changes:
        t = int(e["monotonic_ns"]) - t0
        after = steps.filter(pl.col("t_end_ns") > t)["step"]
        e.update(t_ns=t, first_step=int(after.min()) if after.len() else None,  # type: ignore[arg-type]
                 last_step=last)


def annotate(out: Path, sc: Scenario, *, backend: str, world: int, rank_node: list[int],
             cfg: LabConfig | None, events: list[dict[str, Any]], throttled_ns: dict[str, int], pacing: str,
             seed: int, scratch: Path) -> None:
    """Write the lab topology into ranks.parquet and the manifest; the fault timeline into lab.json."""
    import polars as pl

    from fabricpace.run import read_manifest, write_manifest, write_table_atomic

    ranks_path = out / "ranks.parquet"
    if ranks_path.is_file():
        ranks = pl.read_parquet(ranks_path, glob=False)
        node = [rank_node[r] for r in ranks["rank"].to_list()]
        leaf = [cfg.leaf_of(n) if cfg is not None else None for n in node]
        host = [cfg.node_ns(n) if cfg is not None else f"local-{n}" for n in node]
        ranks = ranks.with_columns(
            pl.Series("node", node, dtype=pl.Int32), pl.Series("leaf", leaf, dtype=pl.Int32),
            pl.Series("host", host, dtype=pl.Utf8),
            pl.Series("nic", [cfg.NODE_IFACE if cfg is not None else "lo"] * len(node), dtype=pl.Utf8),
        )
        write_table_atomic(ranks_path, ranks.to_arrow())
    foreign: dict[str, Any] = {}
    t0: int | None = None
    with contextlib.suppress(OSError, json.JSONDecodeError):
        foreign = json.loads((scratch / "foreign.json").read_text())
    with contextlib.suppress(OSError, json.JSONDecodeError, TypeError, ValueError):
        t0 = int(json.loads((scratch / "t0.json").read_text())["t0_monotonic_ns"])
    place_changes(out, events, t0)
    periods = foreign.get("on_periods_monotonic_ns", [])
    # Foreign-flow bursts on the run's aligned timeline (ns since the observer's t0).
    aligned = [[a - t0, b - t0] for a, b in periods] if t0 is not None else []
    files: dict[str, str] = {}
    if cfg is not None:
        # The lab as a cluster file and a hosts file, for diagnose --cluster, collective, simulate and
        # place (whose proposed hostfile `lab run --placement` replays).
        text = mirror.cluster_yaml(cfg)
        if text is not None:
            (scratch / "cluster.yaml").write_text(text)
            files["file"] = mirror.CLUSTER_FILE
        (scratch / "hosts.txt").write_text(mirror.hosts_text(cfg, rank_node))
        files["hosts"] = mirror.HOSTS_FILE
    topo = {
        "backend": backend,
        "placement": mirror.label(sc.placement),
        "rank_node": rank_node,
        "node_leaf": [cfg.leaf_of(n) for n in range(cfg.nodes)] if cfg is not None else None,
        "fabric": cfg.to_dict() if cfg is not None else None,
    }
    lab = {"scenario": sc.model_dump(), "topology": topo, "events": events,
           "foreign_on_periods_ns": aligned, "t0_monotonic_ns": t0,
           "throttled_time_ns": dict(throttled_ns)}
    (scratch / "lab.json").write_text(json.dumps(lab, indent=2, default=str))
    if out.is_dir():
        if (out / "lab").exists():
            shutil.rmtree(out / "lab")
        shutil.move(str(scratch), str(out / "lab"))
    with contextlib.suppress(Exception):
        m = read_manifest(out)
        m.source = backend
        m.nodes = world
        m.gpus_per_node = 1
        if cfg is not None:
            m.cluster = {"name": mirror.cluster_name(cfg), "kind": "lab", **files,
                         "leaves": cfg.leaves, "uplink": format_rate(cfg.uplink_bps),
                         "node_link": format_rate(cfg.node_link_bps), "node_leaf": topo["node_leaf"]}
        else:
            m.cluster = {"name": "local-loopback", "kind": "local"}
        m.workload = m.workload | {"model": "mlp", **sc.workload.model_dump()}
        m.extra = m.extra | {"scenario": sc.name, "expect": sc.expect, "placement": topo["placement"],
                             "faults": sc.faults.model_dump(exclude_none=True), "seed": seed,
                             "pacing_mode": pacing, "lab": "lab/lab.json",
                             "foreign_on_periods_ns": aligned}
        write_manifest(out, m)
