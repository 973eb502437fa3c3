"""Pacing on scenarios a user writes: scenario folders on disk, run through the real `fabricpace study` CLI.

    .venv/bin/python benchmarks/pacing_stress.py --snapshot               # 40 scenarios (~30 min, niced)
    .venv/bin/python benchmarks/pacing_stress.py --first 40 --points 40 --seed 11   # 40 others, other seeds
    .venv/bin/python benchmarks/pacing_stress.py --first 7 --points 1 --verbose --keep /tmp/p7
    .venv/bin/python benchmarks/pacing_stress.py --list --points 40       # what would run, with cost
    .venv/bin/python benchmarks/pacing_stress.py --targeted [--only ts2.0-to50]   # faults timed against
                                                                          # the guard's windows
    .venv/bin/python benchmarks/pacing_stress.py --bad-files              # one-line errors for mistakes

``--snapshot [REV]`` runs everything on a copy of src/ at REV (HEAD), so a sweep measures one version
of the controller while others edit the tree; ``--mem-limit-gb`` caps each study subprocess.

`pacing_sim.py unseen` calls the simulator in-process on preset clusters and workloads at 2–32 nodes.
This script goes where that check does not. Point ``k`` is drawn from a generator seeded by ``k``: a
user-written cluster (4 or 8 GPUs per node, NVSwitch/NVLink/PCIe inside the node, one NIC per node or
per GPU, leaf-spine/rail-optimized/single switch, ECMP/spray/adaptive, 1:1 to 4:1 oversubscription,
2–32 nodes per leaf; sometimes a preset named in scenario.yaml), a workload (small per-GPU batches of
1–4 samples that rebalancing cannot split, FSDP, tensor/pipeline parallelism, fixed compute, data
loading, per-sample garbage; sometimes a preset with overrides), a noise file (none at all, very high
jitter, or several sources at once with faults that appear or recover mid-run) and a study block
(48–128 nodes, 100 to 1000 steps, 3–5 repeats). The four YAML files are written to a folder, checked
with the project's own loaders, and run as a user would::

    fabricpace study --backend sim --scenario DIR --compare baseline,paced --format json [--repeats R]

in a subprocess (``python -m fabricpace.cli.app`` of the running interpreter, niced). The stdout JSON
gives, per node count, the study's
mean throughput with its 95% CI and the paired throughput change (``delta_pct``, ``delta_ci_pct``:
Student-t over the paired repeats). The paired CV change is not in the JSON, so it is computed here
from the study's own ``study.json`` points (same seeds, Student-t 95% CI). Verdicts, as in
``pacing_sim.py``: "WORSE" when the throughput CI lies entirely below 0, "CV WORSE" when the paired CV
CI lies entirely above +0.001. Also reported: a crash (non-zero exit other than a one-line error,
a traceback on stderr, stdout that is not one JSON document, ``manifest.extra.pacing_error`` or a
``guard/off`` decision in a paced run), one-line validation errors (for reading: is the message
clear?), and the wall time of paced runs against baseline runs (from the run directories' manifest
times, consecutive runs of one study).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
# The CLI of the Python running this script (any virtualenv; honours PYTHONPATH, as --snapshot needs).
FABRICPACE = [sys.executable, "-m", "fabricpace.cli.app"]
CV_FLOOR = 0.001  # smallest CV change called a finding (pacing_sim.py uses the same)
# seconds per simulated rank-step on this machine (128 nodes x 8 GPUs x 1000 steps took ~17 s niced)
COST_PER_RANK_STEP = 1.7e-5


# ------------------------------------------------------------------------------------------ drawing
@dataclass
class Point:
    """One scenario folder and how the study is run on it."""

    k: int
    cluster: dict[str, Any] | str  # a dict is written to cluster.yaml; a str is a preset name
    workload: dict[str, Any] | str
    noise: dict[str, Any] | None  # None: no noise file at all
    study: dict[str, Any]
    cli: list[str] = field(default_factory=list)  # extra CLI options (--repeats, --nodes, ...)
    tags: list[str] = field(default_factory=list)
    label: str = ""  # the name of a targeted scenario; drawn ones are stress-K

    @property
    def name(self) -> str:
        return self.label or f"stress-{self.k}"

    @property
    def nodes(self) -> list[int]:
        i = self.cli.index("--nodes") if "--nodes" in self.cli else -1
        return [int(x) for x in self.cli[i + 1].split(",")] if i >= 0 else list(self.study["nodes"])

    @property
    def repeats(self) -> int:
        i = self.cli.index("--repeats") if "--repeats" in self.cli else -1
        return int(self.cli[i + 1]) if i >= 0 else int(self.study["repeats"])


def _pick(rng: np.random.Generator, items: list[Any], p: list[float] | None = None) -> Any:
    i = int(rng.choice(len(items), p=None if p is None else np.asarray(p) / np.sum(p)))
    return items[i]


def draw_cluster(rng: np.random.Generator, k: int, max_nodes: int) -> tuple[dict[str, Any] | str, list[str]]:
    """A cluster a user might write for their own machines (or, 15% of the time, a preset's name)."""
    if rng.random() < 0.15:
        name = _pick(rng, ["dgx-h100-ib", "p5-efa", "roce-leaf-spine-2to1"])
        return name, [f"preset:{name}"]
    gpn = int(_pick(rng, [4, 8, 2], [0.45, 0.45, 0.1]))
    intra = _pick(rng, ["nvswitch", "nvlink", "pcie"], [0.35, 0.25, 0.4])
    bw = {"nvswitch": rng.uniform(200, 900), "nvlink": rng.uniform(50, 300),
          "pcie": rng.uniform(12, 32)}[intra]
    per = _pick(rng, ["gpu", "node"], [0.5, 0.5])
    if per == "gpu":
        count = int(_pick(rng, [gpn, max(gpn // 2, 1), gpn * 2]))
    else:
        count = int(_pick(rng, [1, 1, 2, 4]))
    topo = _pick(rng, ["leaf_spine", "rail_optimized", "single_switch"], [0.6, 0.2, 0.2])
    net: dict[str, Any] = {
        "topology": topo,
        "nodes_per_leaf": int(_pick(rng, [2, 4, 8, 16, 32])),
        "spines": int(_pick(rng, [1, 2, 4, 8, 16])),
        "oversubscription": float(_pick(rng, [1.0, 1.5, 2.0, 3.0, 4.0])),
        "routing": _pick(rng, ["ecmp", "spray", "adaptive"], [0.5, 0.3, 0.2]),
        "qps_per_connection": int(_pick(rng, [1, 1, 2, 4])),
        "hop_latency_us": round(float(rng.uniform(0.5, 2.0)), 2),
        "nic_latency_us": round(float(rng.uniform(1.5, 6.0)), 2),
    }
    d: dict[str, Any] = {
        "name": f"stress-cluster-{k}",
        "description": "written by benchmarks/pacing_stress.py",
        "nodes": int(_pick(rng, [max_nodes, 2 * max_nodes])),
        "gpus_per_node": gpn,
        "intra_node": {"kind": intra, "bandwidth_gbytes": round(float(bw), 1),
                       "latency_us": round(float(rng.uniform(0.5, 3.0 if intra == "pcie" else 1.0)), 2)},
        "nics": {"per": per, "count": count, "speed_gbps": float(_pick(rng, [100, 200, 400]))},
        "network": net,
    }
    if rng.random() < 0.3:
        d["tuning"] = {"net_efficiency": round(float(rng.uniform(0.6, 0.95)), 2),
                       "channels": int(_pick(rng, [2, 4, 8, 16, 32])),
                       "nvls": bool(intra == "nvswitch" and rng.random() < 0.5)}
    tags = [f"{gpn}gpu", intra, f"nic-{per}x{count}", topo, net["routing"],
            f"os{net['oversubscription']:g}", f"npl{net['nodes_per_leaf']}"]
    return d, tags


def draw_workload(rng: np.random.Generator, k: int, gpn: int) -> tuple[dict[str, Any], list[str]]:
    """A workload file: often 1-4 samples per GPU, FSDP, TP/PP; sometimes a preset with overrides."""
    small = rng.random() < 0.5
    batch = int(rng.integers(1, 5)) if small else int(_pick(rng, [8, 16, 32, 64, 128]))
    if rng.random() < 0.25:
        preset = _pick(rng, ["gpt-1.3b", "gpt-7b", "bert-large", "resnet-50"])
        d: dict[str, Any] = {"preset": preset, "name": f"stress-wl-{k}", "batch_per_gpu": batch}
        if rng.random() < 0.5:
            d["fixed_compute_fraction"] = round(float(rng.uniform(0.05, 0.6)), 2)
        return d, [f"preset:{preset}", f"b{batch}"]
    params = float(10 ** rng.uniform(7.5, 10.3))
    d = {
        "name": f"stress-wl-{k}",
        "parameters": float(f"{params:.3g}"),
        "layers": int(rng.integers(8, 97)),
        "grad_bytes": int(_pick(rng, [2, 4])),
        "batch_per_gpu": batch,
        "optimizer_seconds": round(float(rng.uniform(0, 0.02)), 4),
    }
    if rng.random() < 0.5:  # compute from seconds per step (a user who measured it)
        d["compute"] = {"seconds": round(float(10 ** rng.uniform(-1.7, 0.2)), 4)}
    else:
        d["compute"] = {"flops_per_sample": float(f"{6 * params * float(_pick(rng, [512, 2048, 4096])):.3g}"),
                        "tflops": round(float(rng.uniform(20, 400)), 1)}
    if rng.random() < 0.3:
        d["data_seconds"] = round(float(rng.uniform(0.001, 0.05)), 4)
    if rng.random() < 0.4:
        d["fixed_compute_fraction"] = round(float(rng.uniform(0.05, 0.7)), 2)
    if rng.random() < 0.3:
        d["gc_garbage_mb_per_sample"] = round(float(rng.uniform(0.1, 5.0)), 2)
    kind = _pick(rng, ["ddp", "fsdp", "tp/pp"], [0.55, 0.25, 0.2])
    par: dict[str, Any] = {"kind": "fsdp" if kind == "fsdp" else "ddp"}
    if rng.random() < 0.4:
        par["bucket_mb"] = float(_pick(rng, [5, 10, 50, 100]))
    if kind == "tp/pp":
        tp = int(_pick(rng, [t for t in (1, 2, 4, 8) if t <= gpn]))
        pp = int(_pick(rng, [1, 2, 4]))
        if tp == 1 and pp == 1:
            pp = 2
        par.update(tp=tp, pp=pp, microbatches=int(pp * _pick(rng, [1, 2, 4])))
    d["parallelism"] = par
    tags = [kind if kind != "tp/pp" else f"tp{par['tp']}pp{par['pp']}", f"b{batch}"]
    if "fixed_compute_fraction" in d:
        tags.append("fixed")
    return d, tags


def draw_noise(
    rng: np.random.Generator, k: int, *, world: int, min_nodes: int, links: list[str], steps: int
) -> tuple[dict[str, Any] | None, list[str]]:
    """None (no noise file), a zero-noise file, very high jitter, or 2+ sources with mid-run faults."""
    kind = _pick(rng, ["none", "quiet", "high-jitter", "multi"], [0.1, 0.05, 0.15, 0.7])
    if kind == "none":
        return None, ["no-noise"]
    if kind == "quiet":
        return {"name": f"quiet-{k}"}, ["zero-noise"]
    jit = float(rng.uniform(0.15, 0.5)) if kind == "high-jitter" else float(rng.uniform(0.0, 0.08))
    d: dict[str, Any] = {"name": f"stress-noise-{k}",
                         "jitter": {"cv": round(jit, 3), "distribution": _pick(rng, ["normal", "lognormal"])}}
    if kind == "high-jitter":
        return d, [f"jitter{jit:.2f}"]
    inter = [n for n in links if "nvlink" not in n and "->" in n]
    spine = [n for n in inter if "spine" in n] or inter
    fams = [f for f in ("gc", "slow-rank", "slow-node", "pauses", "tenants", "slow-link", "flap")
            if rng.random() < 0.45]
    while len(fams) < 2:
        f = str(rng.choice(["gc", "slow-rank", "slow-node", "pauses", "tenants", "slow-link", "flap"]))
        if f not in fams:
            fams.append(f)

    def when() -> dict[str, int]:
        r = rng.random()
        if r < 0.3:
            return {"from_step": int(rng.integers(steps // 5, max(steps * 4 // 5, steps // 5 + 1)))}
        if r < 0.45:
            return {"to_step": int(rng.integers(steps // 5, max(steps * 4 // 5, steps // 5 + 1)))}
        if r < 0.55:
            a = int(rng.integers(steps // 10, steps // 2))
            return {"from_step": a, "to_step": int(a + rng.integers(10, max(steps // 3, 11)))}
        return {}

    if "gc" in fams:
        d["gc"] = {
            "garbage_mb_per_step": round(float(rng.uniform(0.5, 40)), 2),
            "garbage_cv": round(float(rng.uniform(0, 0.8)), 2),
            "threshold_mb": round(float(10 ** rng.uniform(1.7, 3.5)), 1),
            "pause_ms_base": round(float(rng.uniform(0, 150)), 2),
            "pause_ms_per_mb": round(float(rng.uniform(0, 0.2)), 3),
            "young_pause_ms_base": round(float(_pick(rng, [0.0, rng.uniform(0, 8)])), 2),
            "promoted_fraction": round(float(rng.uniform(0.1, 1.0)), 2),
        }
    slow = []
    if "slow-rank" in fams:
        for _ in range(int(_pick(rng, [1, 1, 2, 3]))):
            factor = float(_pick(rng, [rng.uniform(1.01, 1.08), rng.uniform(1.1, 3.0)]))
            slow.append({"rank": int(rng.integers(0, world)), "factor": round(factor, 3), **when()})
    if "slow-node" in fams:
        slow.append({"node": int(rng.integers(0, min_nodes)),
                     "factor": round(float(_pick(rng, [rng.uniform(1.01, 1.08), rng.uniform(1.1, 2.0)])), 3),
                     **when()})
    if slow:
        d["slow"] = slow
    if "pauses" in fams:
        d["pauses"] = {"rate_hz": round(float(rng.uniform(0.1, 10)), 2),
                       "duration_ms": round(float(rng.uniform(1, 80)), 2),
                       "duration_cv": round(float(rng.uniform(0.2, 2.0)), 2)}
    if "tenants" in fams and spine:
        n = int(rng.integers(1, min(12, len(spine)) + 1))
        d["foreign"] = []
        for i in rng.choice(len(spine), size=n, replace=False):
            a, _, b = spine[int(i)].partition("->")
            pair = [spine[int(i)]] + ([f"{b}->{a}"] if f"{b}->{a}" in links else [])
            scale = round(float(rng.uniform(0.1, 0.9)), 2)
            tenant: dict[str, Any] = {"links": pair, "scale": scale, **when()}
            if rng.random() < 0.7:
                tenant.update(duty=round(float(rng.uniform(0.05, 0.8)), 2),
                              burst_steps=round(float(rng.uniform(1, 60)), 1))
            d["foreign"].append(tenant)
    link_faults = []
    if "slow-link" in fams and inter:
        link_faults.append({"link": str(rng.choice(inter)), "scale": round(float(rng.uniform(0.1, 0.9)), 2),
                            **when()})
    if "flap" in fams and inter:
        period = int(rng.integers(4, 150))
        link_faults.append({"link": str(rng.choice(inter)), "scale": round(float(rng.uniform(0.1, 0.7)), 2),
                            "flap_period_steps": period, "flap_down_steps": int(rng.integers(1, period))})
    if link_faults:
        d["links"] = link_faults
    fams = [f for f in fams if (f not in ("tenants", "slow-link", "flap")) or inter]
    midrun = any("from_step" in x or "to_step" in x for x in [*slow, *d.get("foreign", []), *link_faults])
    return d, ["+".join(fams) + ("+midrun" if midrun else "")]


def draw_point(k: int, *, max_nodes: int = 128) -> Point:
    """Scenario ``k``: everything drawn from a generator seeded by ``k`` (independent of --seed)."""
    from fabricpace.fabric import load_cluster
    from fabricpace.sim.transfers import link_names

    rng = np.random.default_rng([0x57E55, k])
    counts = [n for n in (48, 64, 96, 128) if n <= max_nodes] or [max_nodes]
    nodes = sorted({int(_pick(rng, counts)) for _ in range(int(_pick(rng, [1, 1, 2])))})
    if rng.random() < 0.15:  # one small count beside the large ones, as a user's study list would
        nodes = sorted({int(_pick(rng, [2, 4, 8, 16])), *nodes})
    steps = int(_pick(rng, [100, 300, int(rng.integers(600, 1001))], [0.25, 0.3, 0.45]))
    warmup = int(_pick(rng, [50, 20, 10])) if steps == 100 else 50
    repeats = int(_pick(rng, [3, 4, 5], [0.25, 0.5, 0.25]))
    cluster, ctags = draw_cluster(rng, k, max(nodes))
    cl = load_cluster(cluster) if isinstance(cluster, str) else None
    gpn = cl.gpus_per_node if cl is not None else int(cluster["gpus_per_node"])  # type: ignore[index]
    if cl is not None and cl.nodes < max(nodes):
        nodes = [n for n in nodes if n <= cl.nodes] or [cl.nodes]
    workload, wtags = draw_workload(rng, k, gpn)
    pp = int(workload.get("parallelism", {}).get("pp", 1)) if isinstance(workload, dict) else 1
    nodes = [n for n in nodes if n % pp == 0] or [max(nodes) // pp * pp]
    if cl is None:
        from fabricpace.fabric.cluster import cluster_from_dict

        cl = cluster_from_dict(cluster, where="(drawn)")
    links = link_names(cl, max(nodes)) or []
    noise, ntags = draw_noise(rng, k, world=min(nodes) * gpn, min_nodes=min(nodes), links=links, steps=steps)
    study = {"nodes": nodes, "steps": steps, "warmup": warmup, "repeats": repeats}
    cli: list[str] = []
    if rng.random() < 0.2:  # the checker may pass --repeats on the command line instead
        cli += ["--repeats", str(int(_pick(rng, [3, 4, 5])))]
    par = workload.get("parallelism", {}) if isinstance(workload, dict) else {}
    dp_only = par.get("tp", 1) == 1 and par.get("pp", 1) == 1
    if dp_only and rng.random() < 0.1:
        cli += ["--node-order", "shuffled"]
    pt = Point(k=k, cluster=cluster, workload=workload, noise=noise, study=study, cli=cli,
               tags=ctags + wtags + ntags + (["shuffled"] if "--node-order" in cli else []))
    # Keep a point inside the sweep's time budget: drop the largest extra node count, then halve the
    # steps (the noise's step ranges were drawn for the longer run: a fault may then start late or never).
    while cost(pt, gpn) > 150 and len(pt.study["nodes"]) > 1:
        pt.study["nodes"] = pt.study["nodes"][:-1]
    while cost(pt, gpn) > 150 and pt.study["steps"] > 200:
        pt.study["steps"] = pt.study["steps"] // 2
    pt.tags.append(f"{pt.study['steps']}st" + (f"/wu{warmup}" if warmup != 50 else ""))
    return pt


def cost(pt: Point, gpn: int) -> float:
    """Estimated seconds of the point's study on this machine (both modes, every repeat)."""
    return sum(n * gpn * pt.study["steps"] * pt.repeats * 2 * COST_PER_RANK_STEP + 1.0 for n in pt.nodes)


# ------------------------------------------------------------------------------- targeted scenarios
def targeted_points() -> list[Point]:
    """Scenarios written against the guard's timing, on the paper's cluster and workload (copied into
    each folder as user files). A straggler that recovers right when the first window ends is a
    plausible event (a data loader warming its cache, a thermal throttle that ends); the guard's first
    OFF window is the very window that proposed the trial."""
    paper = ROOT / "src/fabricpace/data/scenarios/paper"
    cl = yaml.safe_load((paper / "cluster.yaml").read_text())
    wl = yaml.safe_load((paper / "workload.yaml").read_text())
    spine = [f"leaf{i}->spine{j}" for i in (0, 1) for j in range(4)]
    spine += [f"spine{j}->leaf{i}" for i in (0, 1) for j in range(4)]

    def pt(label: str, noise: dict[str, Any], nodes: list[int], steps: int, workload: Any = None,
           repeats: int = 4) -> Point:
        return Point(k=-1, label=label, cluster=cl, workload=workload or wl,
                     noise={"name": label, "jitter": {"cv": 0.02}, **noise},
                     study={"nodes": nodes, "steps": steps, "warmup": 50, "repeats": repeats},
                     tags=[label, f"{steps}st"])

    def slow(factor: float, *ranges: tuple[int | None, int | None], node: bool = False) -> dict[str, Any]:
        who = {"node": 1} if node else {"rank": 3}
        out = []
        for a, b in ranges:
            r: dict[str, Any] = {**who, "factor": factor}
            if a:
                r["from_step"] = a
            if b is not None:
                r["to_step"] = b
            out.append(r)
        return {"slow": out}

    small = {**wl, "batch_per_gpu": 2}
    return [
        pt("ts2.0-to50", slow(2.0, (0, 50)), [4, 8, 16], 300),
        pt("ts1.3-to50", slow(1.3, (0, 50)), [4, 8, 16], 300),
        pt("ts3.0-to50-100st", slow(3.0, (0, 50)), [4, 16], 100),
        pt("ts2.0-to53", slow(2.0, (0, 53)), [4, 16], 300),
        pt("tnode1.5-to50", slow(1.5, (0, 50), node=True), [4, 8, 16], 300),
        pt("ts2.0-to50-b2", slow(2.0, (0, 50)), [4, 16], 300, workload=small),
        pt("ts2.0-to100-1000st", slow(2.0, (0, 100)), [4, 16], 1000),
        pt("ts2.0-from100-to150", slow(2.0, (100, 150)), [4, 16], 500),
        # slow in windows 0, 3-4, 7-8: every first pair of an ABBA trial started at step 50 sees it
        pt("ts2.0-periodic", slow(2.0, (0, 50), (150, 250), (350, 450)), [4, 16], 500),
        # a persistent straggler on a workload whose compute is mostly a fixed per-step part
        pt("ts1.3-fixed0.7", slow(1.3, (0, None)), [4, 16], 300,
           workload={**wl, "fixed_compute_fraction": 0.7}),
        pt("tenants-150-250", {"foreign": [{"links": spine, "scale": 0.3, "from_step": 150, "to_step": 250}]},
           [8], 500),
    ]



# ---------------------------------------------------------------------------------------- writing
def write_point(pt: Point, folder: Path) -> Path:
    """Write scenario.yaml and the files it names, as a user would."""
    folder.mkdir(parents=True, exist_ok=True)
    sc: dict[str, Any] = {"name": pt.name, "description": " ".join(pt.tags)}
    if isinstance(pt.cluster, str):
        sc["cluster"] = pt.cluster
    else:
        (folder / "cluster.yaml").write_text(yaml.safe_dump(pt.cluster, sort_keys=False))
        sc["cluster"] = "cluster.yaml"
    (folder / "workload.yaml").write_text(yaml.safe_dump(pt.workload, sort_keys=False))
    sc["workload"] = "workload.yaml"
    if pt.noise is not None:
        (folder / "noise.yaml").write_text(yaml.safe_dump(pt.noise, sort_keys=False))
        sc["noise"] = "noise.yaml"
    sc["study"] = pt.study
    (folder / "scenario.yaml").write_text(yaml.safe_dump(sc, sort_keys=False))
    return folder


def validate_point(folder: Path, nodes: list[int]) -> str | None:
    """The project's own loaders on the written files; the InputError message, or None when valid.
    Anything but an InputError propagates (a crash of the loader is a bug to report)."""
    from fabricpace._errors import InputError
    from fabricpace.fabric import load_cluster
    from fabricpace.sim import load_noise, load_workload
    from fabricpace.sim.transfers import link_names
    from fabricpace.study.scenario import load_scenario

    try:
        sc = load_scenario(folder)
        cl = load_cluster(sc.cluster)
        load_workload(sc.workload)
        noise = load_noise(sc.noise)
        every = link_names(cl, cl.nodes) or []
        for n in nodes:
            noise.validate_against(world=n * cl.gpus_per_node, nodes=n, links=link_names(cl, n),
                                   cluster_links=every, cluster_nodes=cl.nodes)
    except InputError as exc:
        return str(exc)
    return None


# ---------------------------------------------------------------------------------------- running
_T975 = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23]


def _mean_ci(x: np.ndarray) -> tuple[float, float, float]:
    m = float(x.mean())
    if x.size < 2:
        return m, math.nan, math.nan
    half = _T975[min(x.size - 2, len(_T975) - 1)] * float(x.std(ddof=1)) / math.sqrt(x.size)
    return m, m - half, m + half


def code_version() -> str:
    """The snapshot's commit, else HEAD and whether the controller or simulator differ from it (others
    edit the tree while this runs)."""
    if os.environ.get("FP_STRESS_SNAPSHOT"):
        return os.environ["FP_STRESS_SNAPSHOT"] + " (snapshot)"

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    dirty = git("status", "--porcelain", "--", "src/fabricpace/pacing", "src/fabricpace/sim")
    return git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")



MEM_LIMIT_GB = 12.0  # address-space cap of each study subprocess (--mem-limit-gb); 0 = none


def _limit_memory() -> None:
    """In the study subprocess: cap its address space, so a study that outgrows the machine fails
    with MemoryError instead of pushing other processes into the kernel's OOM killer."""
    import resource

    if MEM_LIMIT_GB > 0:
        cap = int(MEM_LIMIT_GB * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def run_study(folder: Path, out: Path, cli: list[str], *, seed: int, figures: bool) -> dict[str, Any]:
    cmd = ["nice", "-n", "19", *FABRICPACE, "study", "--backend", "sim", "--scenario", str(folder),
           "--compare", "baseline,paced", "--format", "json", "--seed", str(seed), "--out", str(out), *cli]
    if not figures:
        cmd.append("--no-figures")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=folder.parent, preexec_fn=_limit_memory)
    res: dict[str, Any] = {"cmd": cmd, "rc": p.returncode, "wall_s": time.perf_counter() - t0,
                           "stderr_tail": p.stderr[-3000:]}
    problems = []
    if "Traceback" in p.stderr:
        problems.append("traceback on stderr")
    if "MemoryError" in p.stderr or "memory allocation of" in p.stderr or p.returncode == -9:
        problems.append(f"out of memory (cap {MEM_LIMIT_GB:g} GiB; exit code {p.returncode})")
    elif p.returncode not in (0, 2):
        problems.append(f"exit code {p.returncode}")
    if p.returncode == 2:
        lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith(("study", " "))]
        res["error"] = lines[-1] if lines else p.stderr.strip()
    if p.returncode == 0:
        try:
            res["json"] = json.loads(p.stdout)
        except json.JSONDecodeError as exc:
            problems.append(f"stdout is not one JSON document ({exc})")
    res["problems"] = problems
    return res


def analyse(res: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    """One row per node count: the study's numbers, paired CV change, decisions, timing, problems."""
    import polars as pl

    study = json.loads((out / "study.json").read_text())
    pts = study["points"]
    # Wall time of each run: manifests are written last, runs are sequential in plan order.
    stamps = sorted((Path(p["run_dir"], "manifest.json").stat().st_mtime, i) for i, p in enumerate(pts))
    dur = {i: t - stamps[j - 1][0] for j, (t, i) in enumerate(stamps) if j > 0}
    rows = []
    for r in res["json"]["rows"]:
        if r["mode"] != "paced":
            continue
        n = r["nodes"]
        base_row = next(x for x in res["json"]["rows"] if x["nodes"] == n and x["mode"] == "baseline")
        b = {p["repeat"]: p for p in pts if p["nodes"] == n and p["mode"] == "baseline"}
        q = {p["repeat"]: p for p in pts if p["nodes"] == n and p["mode"] == "paced"}
        reps = sorted(set(b) & set(q))
        dcv = np.array([q[i]["cv"] - b[i]["cv"] for i in reps])
        cv_m, cv_lo, cv_hi = _mean_ci(dcv)
        per_rep = [100 * (q[i]["throughput"] / b[i]["throughput"] - 1) for i in reps]
        trials = keeps = 0
        kept: list[str] = []
        errors: list[str] = []
        first_keep: list[str] = []
        for i in reps:
            run_dir = Path(q[i]["run_dir"])
            man = json.loads((run_dir / "manifest.json").read_text())
            if man.get("extra", {}).get("pacing_error"):
                errors.append(f"r{i}: pacing_error {man['extra']['pacing_error']}")
            f = run_dir / "pacing.parquet"
            if not f.exists():
                continue
            dec = pl.read_parquet(f).unique(subset=["step", "policy", "action", "reason"]).sort("step")
            trials += dec.filter(pl.col("action") == "enable").height
            k = dec.filter((pl.col("policy") == "guard") & (pl.col("action") == "keep"))
            keeps += k.height > 0
            for reason in k["reason"].to_list():
                kept.append(reason.split(" kept")[0])
            if k.height:
                first_keep.append(f"r{i}@{k['step'][0]}")
            off = dec.filter(pl.col("action") == "off")
            errors += [f"r{i}: {x}" for x in off["reason"].to_list()]
        tb = [dur[j] for j, p in enumerate(pts) if p["nodes"] == n and p["mode"] == "baseline" and j in dur]
        tq = [dur[j] for j, p in enumerate(pts) if p["nodes"] == n and p["mode"] == "paced" and j in dur]
        lo, hi = r["delta_ci_pct"] if r["delta_ci_pct"] else (math.nan, math.nan)
        verdict = "better" if lo > 0 else "WORSE" if hi < 0 else "no change"
        cv_verdict = "CV lower" if cv_hi < -CV_FLOOR else "CV WORSE" if cv_lo > CV_FLOOR else "CV same"
        rows.append({
            "nodes": n, "repeats": len(reps), "steps": study["plan"]["steps"], "counted": r["steps"],
            "base": base_row["throughput"], "base_ci": base_row["throughput_ci"],
            "paced": r["throughput"], "paced_ci": r["throughput_ci"],
            "delta_pct": r["delta_pct"], "delta_lo": lo, "delta_hi": hi, "per_repeat_pct": per_rep,
            "cv_base": base_row["cv"], "cv_paced": r["cv"], "cv_delta": cv_m, "cv_lo": cv_lo, "cv_hi": cv_hi,
            "verdict": verdict, "cv_verdict": cv_verdict, "trials": trials, "runs_kept": keeps,
            "kept": sorted(set(kept)), "first_keep": first_keep, "pacing_errors": errors,
            "time_ratio": (float(np.median(tq)) / float(np.median(tb))) if tb and tq else math.nan,
            "time_base_s": float(np.median(tb)) if tb else math.nan,
            "time_paced_s": float(np.median(tq)) if tq else math.nan,
            "cv_base_ci": base_row["cv_ci"], "cv_paced_ci": r["cv_ci"],
        })
    return rows


def decisions(out: Path, nodes: int) -> list[str]:
    """Every decision (step, policy/action, value, reason) of each paced run at ``nodes``."""
    import polars as pl

    lines = []
    for run_dir in sorted(out.glob(f"runs/sim-n{nodes}-paced-r*")):
        f = run_dir / "pacing.parquet"
        if not f.exists():
            lines.append(f"  {run_dir.name}: no decisions")
            continue
        dec = pl.read_parquet(f).unique(subset=["step", "policy", "action", "reason"]).sort("step")
        lines.append(f"  {run_dir.name}:")
        for s, pol, act, val, why in dec.select("step", "policy", "action", "value", "reason").iter_rows():
            lines.append(f"    {s:5d} {pol}/{act} {val:+.4g}  {why}")
    return lines


def _ci(m: float, lo: float, hi: float, f: str) -> str:
    return f"{m:{f}} ({lo:{f}}..{hi:{f}})"


def line(name: str, r: dict[str, Any]) -> str:
    """One printed row of a point and node count."""
    err = "  ERRORS " + "; ".join(r["pacing_errors"]) if r["pacing_errors"] else ""
    return (
        f"{name:11s} {r['nodes']:4d}n {r['steps']:4d}st x{r['repeats']} "
        f"{r['base']:10.1f} -> {r['paced']:10.1f}"
        f"  Δ {_ci(r['delta_pct'], r['delta_lo'], r['delta_hi'], '+.2f')}%"
        f"  CV {r['cv_base']:.3f} -> {r['cv_paced']:.3f}"
        f" Δ {_ci(r['cv_delta'], r['cv_lo'], r['cv_hi'], '+.3f')}"
        f"  {r['verdict']}, {r['cv_verdict']}  trials {r['trials']} kept {r['runs_kept']}/{r['repeats']}"
        f" {','.join(r['kept'])}  time x{r['time_ratio']:.2f}{err}"
    )


def md_row(name: str, pt: Point, r: dict[str, Any]) -> str:
    """The same row for the Markdown table."""
    return (
        f"| {name} | {' '.join(pt.tags)} | {r['nodes']} | {r['steps']} | {r['repeats']} | {r['base']:.1f} | "
        f"{r['paced']:.1f} | {_ci(r['delta_pct'], r['delta_lo'], r['delta_hi'], '+.2f')}% | "
        f"{r['cv_base']:.3f} → {r['cv_paced']:.3f} {_ci(r['cv_delta'], r['cv_lo'], r['cv_hi'], '+.3f')} | "
        f"{r['verdict']}, {r['cv_verdict']} | {r['trials']} | {r['runs_kept']}/{r['repeats']} "
        f"{','.join(r['kept'])} | {r['time_ratio']:.2f} |"
    )



# ------------------------------------------------------------------------------------------ bad files
# Mistakes a user makes in the four files: (file, what, change). A change is a dict merged into the
# file's YAML (None deletes the key), or a string that replaces the whole file.
BAD: list[tuple[str, str, Any]] = [
    ("cluster", "no spines", {"network": {"spines": 0}}),
    ("cluster", "3 NICs per GPU on 8 GPUs", {"nics": {"per": "gpu", "count": 3}}),
    ("cluster", "job larger than the cluster", {"nodes": 2}),
    ("cluster", "YAML syntax error", "name: x\nnodes: [4\n"),
    ("cluster", "unknown routing", {"network": {"routing": "ecmpp"}}),
    ("workload", "0 samples per GPU", {"batch_per_gpu": 0}),
    ("workload", "misspelt field", {"batch_per_gpus": 4}),
    ("workload", "pp that does not divide the nodes", {"parallelism": {"pp": 3, "microbatches": 3}}),
    ("workload", "fewer micro-batches than stages", {"parallelism": {"pp": 2, "microbatches": 1}}),
    ("workload", "tp larger than a node", {"parallelism": {"tp": 16}}),
    ("workload", "tp that does not divide a node", {"parallelism": {"tp": 3}}),
    ("workload", "unknown preset", {"preset": "gpt-13b"}),
    ("workload", "compute with neither seconds nor flops", {"compute": {"flops_per_sample": None}}),
    ("workload", "preset with a misspelt override", {"batch_per_gpu": None, "batch_size": 8}),
    ("noise", "slow rank outside the job", {"slow": [{"rank": 9999, "factor": 1.5}]}),
    ("noise", "link not in the cluster", {"links": [{"link": "leaf99->spine0", "scale": 0.5}]}),
    ("noise", "flap down longer than its period",
     {"links": [{"link": "leaf0->spine0", "scale": 0.5, "flap_period_steps": 10, "flap_down_steps": 20}]}),
    ("noise", "fault ends before it starts", {"slow": [{"rank": 1, "factor": 1.5, "from_step": 90,
                                                         "to_step": 10}]}),
    ("noise", "slow with both rank and node", {"slow": [{"rank": 1, "node": 1, "factor": 1.5}]}),
    ("noise", "tenant on a link name with a typo", {"foreign": [{"links": ["leaf0-spine0"], "scale": 0.5}]}),
    ("noise", "negative jitter", {"jitter": {"cv": -0.1}}),
    ("noise", "a list instead of a mapping", "- jitter\n"),
    ("scenario", "no node counts", {"study": {"nodes": []}}),
    ("scenario", "warm-up longer than the run", {"study": {"steps": 60, "warmup": 80}}),
    ("scenario", "workload file that does not exist", {"workload": "workloads.yaml"}),
    ("scenario", "no cluster", {"cluster": None}),
    ("scenario", "node count as a string", {"study": {"nodes": "4,8"}}),
    ("scenario", "zero repeats", {"study": {"repeats": 0}}),
]


def _merge(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in change.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def bad_files(tmp: Path, seed: int) -> int:
    """Each BAD mistake in a copy of the paper scenario (4 nodes): the study must exit 2 with one line."""
    paper = ROOT / "src/fabricpace/data/scenarios/paper"
    good = {f: yaml.safe_load((paper / f"{f}.yaml").read_text()) for f in ("cluster", "workload", "noise")}
    good["scenario"] = {"name": "bad", "cluster": "cluster.yaml", "workload": "workload.yaml",
                        "noise": "noise.yaml",
                        "study": {"nodes": [4], "steps": 60, "warmup": 10, "repeats": 1}}
    failures = 0
    for i, (which, what, change) in enumerate(BAD):
        folder = tmp / f"bad-{i}"
        folder.mkdir(parents=True)
        for f, doc in good.items():
            text = yaml.safe_dump(doc, sort_keys=False)
            if f == which and isinstance(change, str):
                text = change
            elif f == which:
                text = yaml.safe_dump(_merge(doc, change), sort_keys=False)
            (folder / f"{f}.yaml").write_text(text)
        res = run_study(folder, folder / "study", [], seed=seed, figures=False)
        lines = [ln for ln in res["stderr_tail"].splitlines() if ln.strip()]
        ok = res["rc"] == 2 and not res["problems"] and len(lines) == 1
        failures += not ok
        msg = lines[-1] if lines else "(nothing on stderr)"
        verdict = "ok" if ok else f"NOT A ONE-LINE ERROR (exit {res['rc']}, {len(lines)} stderr lines)"
        print(f"{which:9s} {what:42s} {verdict}: {msg[:400]}", flush=True)
    print(f"bad files: {len(BAD) - failures} of {len(BAD)} gave a one-line error and exit 2", flush=True)
    return failures



# ------------------------------------------------------------------------------------------- main
def reexec_on_snapshot(rev: str, argv: list[str], *, script: str = __file__,
                       env_key: str = "FP_STRESS_SNAPSHOT") -> None:
    """Copy src/ at ``rev`` to a temporary folder and run ``script`` again with it first on
    PYTHONPATH, so the loaders here and every study subprocess use one fixed version of the code.
    ``env_key`` is set to the commit in the new process (how it knows it runs on the snapshot)."""
    commit = subprocess.run(["git", "rev-parse", "--short", rev], capture_output=True, text=True, cwd=ROOT,
                            check=True).stdout.strip()
    snap = Path(tempfile.mkdtemp(prefix=f"fp-snapshot-src-{commit}-"))
    archive = subprocess.run(["git", "archive", commit, "src"], capture_output=True, cwd=ROOT, check=True)
    subprocess.run(["tar", "-x", "-C", str(snap)], input=archive.stdout, check=True)
    path = os.pathsep.join([str(snap / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, env_key: commit, "PYTHONPATH": path}
    print(f"running on a snapshot of src/ at {commit}: {snap}", file=sys.stderr, flush=True)
    os.execve(sys.executable, [sys.executable, script, *argv], env)



def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=40, help="number of scenarios")
    ap.add_argument("--first", type=int, default=0, help="index of the first scenario")
    ap.add_argument("--seed", type=int, default=1, help="study --seed (repeat i uses seed + i)")
    ap.add_argument("--max-nodes", type=int, default=128, help="largest node count drawn (48, 64, 96, 128)")
    ap.add_argument("--figures", action="store_true", help="let the study write figures.html too")
    ap.add_argument("--keep", default="", help="keep every scenario folder and study output here")
    ap.add_argument("--verbose", action="store_true", help="print the paced runs' decisions of every point")
    ap.add_argument("--targeted", action="store_true",
                    help="run the targeted scenarios (faults timed against the guard's windows) instead")
    ap.add_argument("--only", action="append", default=[], help="--targeted: only this scenario (repeatable)")
    ap.add_argument("--bad-files", action="store_true",
                    help="write files with the mistakes users make; each must give a one-line error (exit 2)")
    ap.add_argument("--list", action="store_true", help="only print the drawn scenarios and cost estimates")
    ap.add_argument("--json", default="", help="write all results here")
    ap.add_argument("--markdown", default="", help="write the results table here (Markdown)")
    ap.add_argument("--snapshot", nargs="?", const="HEAD", default="",
                    help="run every study on a copy of src/ at this commit (default HEAD), not the live tree")
    ap.add_argument("--mem-limit-gb", type=float, default=12.0,
                    help="address-space cap of each study subprocess in GiB (0: none)")
    args = ap.parse_args(argv)
    globals()["MEM_LIMIT_GB"] = args.mem_limit_gb  # read by _limit_memory in each study subprocess
    if args.snapshot and not os.environ.get("FP_STRESS_SNAPSHOT"):
        reexec_on_snapshot(args.snapshot, sys.argv[1:] if argv is None else argv)

    from rich.console import Console
    from rich.progress import Progress

    if args.bad_files:
        with tempfile.TemporaryDirectory(prefix="fp-pacing-stress-bad-") as tmpdir:
            bad_files(Path(tmpdir), args.seed)
        return
    if args.targeted:
        points = [p for p in targeted_points() if not args.only or p.name in args.only]
    else:
        ks = range(args.first, args.first + args.points)
        points = [draw_point(k, max_nodes=args.max_nodes) for k in ks]
    if args.list:
        total = 0.0
        for pt in points:
            gpn = int(pt.cluster["gpus_per_node"]) if isinstance(pt.cluster, dict) else 8
            total += cost(pt, gpn)
            print(f"{pt.name:11s} nodes {pt.nodes} steps {pt.study['steps']} repeats {pt.repeats} "
                  f"~{cost(pt, gpn):.0f}s  {' '.join(pt.tags)}")
        print(f"estimated total {total / 60:.1f} min")
        return
    keep = Path(args.keep) if args.keep else None
    tmp = Path(tempfile.mkdtemp(prefix="fp-pacing-stress-"))
    results: dict[str, Any] = {}
    table: list[str] = []
    counts = {"rows": 0, "worse": 0, "cv_worse": 0, "crash": 0, "invalid": 0, "slow": 0}
    t_start = time.perf_counter()
    try:
        with Progress(transient=True, console=Console(stderr=True)) as bar:
            task = bar.add_task("stress scenarios", total=len(points))
            for pt in points:
                name = pt.name
                bar.update(task, description=f"{name} {pt.nodes} nodes {pt.study['steps']} steps")
                base = (keep or tmp) / name
                if base.exists():
                    shutil.rmtree(base)
                folder = write_point(pt, base / "scenario")
                entry: dict[str, Any] = {"tags": pt.tags, "nodes": pt.nodes, "cli": pt.cli, "study": pt.study,
                                         "code": code_version()}
                try:
                    invalid = validate_point(folder, pt.nodes)
                except Exception as exc:  # a loader that crashes instead of a one-line error is a bug
                    invalid = None
                    entry["problems"] = [f"loader crashed: {exc!r}"]
                    counts["crash"] += 1
                if invalid is not None:
                    counts["invalid"] += 1
                    entry["invalid"] = invalid
                    print(f"{name:11s} INVALID (loader): {invalid}", flush=True)
                if invalid is None and not entry.get("problems"):
                    res = run_study(folder, base / "study", pt.cli, seed=args.seed, figures=args.figures)
                    entry.update({k: v for k, v in res.items() if k != "json"})
                    if res["problems"]:
                        counts["crash"] += 1
                        print(f"{name:11s} CRASH: {res['problems']}\n{res['stderr_tail']}", flush=True)
                    elif res["rc"] == 2:
                        counts["invalid"] += 1
                        print(f"{name:11s} one-line error from the study (loaders passed): {res['error']}",
                              flush=True)
                    else:
                        rows = analyse(res, base / "study")
                        entry["rows"] = rows
                        for r in rows:
                            counts["rows"] += 1
                            counts["worse"] += r["verdict"] == "WORSE"
                            counts["cv_worse"] += r["cv_verdict"] == "CV WORSE"
                            # a run is "much slower" when paced takes 1.5x and over 5 s more than baseline
                            extra_s = r["time_paced_s"] - r["time_base_s"]
                            counts["slow"] += r["time_ratio"] > 1.5 and extra_s > 5
                            if r["pacing_errors"]:
                                counts["crash"] += 1
                            flag = " <<<" if r["verdict"] == "WORSE" or r["cv_verdict"] == "CV WORSE" else ""
                            print(line(name, r) + flag, flush=True)
                            table.append(md_row(name, pt, r))
                            if args.verbose or flag:
                                print("\n".join(decisions(base / "study", r["nodes"])), flush=True)
                results[name] = entry
                if keep is None:
                    shutil.rmtree(base, ignore_errors=True)
                bar.advance(task)
    finally:
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
    summary = (
        f"stress points {len(points)} ({counts['rows']} scenario x node-count rows, seed {args.seed}): "
        f"throughput WORSE {counts['worse']}, CV WORSE {counts['cv_worse']}, crashes {counts['crash']}, "
        f"one-line errors {counts['invalid']}, paced runs >1.5x and >5 s slower {counts['slow']}; "
        f"{(time.perf_counter() - t_start) / 60:.1f} min"
    )
    print(summary, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "points": results}, indent=2, default=str))
    if args.markdown:
        head = ("| point | scenario | nodes | steps | repeats | baseline | paced | Δ throughput (95% CI) | "
                "CV base → paced (Δ, 95% CI) | verdict | trials | runs kept | time paced/base |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
        Path(args.markdown).write_text(f"{summary}\n\n{head}" + "\n".join(table) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
