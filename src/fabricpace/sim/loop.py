"""``simulate``: one simulated training run, written as a run directory (manifest source "sim").

Wires the pieces together: cluster (fabric model), workload, noise → transfer times per step → the
engine, block by block → the recorder. With a pacing ``controller`` (``fabricpace.pacing.Controller``)
the loop builds window summaries from the arrays every ``window`` steps, calls
``controller.update(step, summaries)`` exactly as each real rank does, and applies the returned
``PacingState`` through the actuator twins from the next step on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from fabricpace._errors import ConfigError, InputError
from fabricpace.pacing.state import PacingState
from fabricpace.run.destination import check_new_dir
from fabricpace.run.manifest import Manifest
from fabricpace.sim.engine import BlockResult, Engine
from fabricpace.sim.noise import Noise, load_noise
from fabricpace.sim.record import Recorder
from fabricpace.sim.summaries import window_summaries
from fabricpace.sim.transfers import TransferModel, link_names
from fabricpace.sim.twins import apply_state
from fabricpace.sim.workload import Workload, load_workload


@dataclass(frozen=True, kw_only=True)
class SimOptions:
    """Tunables of the simulator loop (not of the simulated job)."""

    window: int = 50  # steps per window summary (the observer's default window)
    block_elements: int = 3_000_000  # ranks × collectives × steps held in memory at once
    record_collectives: bool = True  # False drops the per-rank collectives table (huge scales)
    # A fixed pacing state applied from step 0 with no controller and no guard (the simulator's
    # ``Pacer.pin``): what an actuator gives at best when it is on all the time. Ignored when a
    # controller is given.
    pinned: PacingState | None = None


def _load_cluster(cluster: Any) -> Any:
    from fabricpace.fabric import load_cluster

    return load_cluster(cluster)


def _check(cluster: Any, workload: Workload, *, nodes: int, steps: int, seed: int) -> None:
    if seed < 0:
        # numpy's SeedSequence refuses negative entropy with a bare ValueError.
        raise InputError(f"--seed {seed}: must be 0 or more")
    if nodes < 1:
        raise InputError(f"--nodes {nodes}: must be at least 1")
    if steps < 1:
        raise InputError(f"--steps {steps}: must be at least 1")
    if nodes > cluster.nodes:
        raise InputError(
            f"--nodes {nodes}: cluster {cluster.name!r} has only {cluster.nodes} nodes; use fewer nodes "
            "or a bigger cluster file"
        )
    p = workload.spec.parallelism
    if cluster.gpus_per_node % p.tp:
        raise ConfigError(
            f"{workload.source}: field 'parallelism.tp': {p.tp} must divide gpus_per_node "
            f"({cluster.gpus_per_node}) — tensor parallelism stays inside a node"
        )
    if nodes % p.pp:
        raise ConfigError(
            f"{workload.source}: field 'parallelism.pp': {p.pp} must divide the job's node count ({nodes}); "
            "each pipeline stage spans nodes/pp whole nodes"
        )


def _check_job(
    cl: Any,
    wl: Workload,
    nz: Noise,
    *,
    nodes: int,
    steps: int,
    seed: int,
    node_order: str | Sequence[int] | None,
) -> tuple[np.ndarray | None, list[str]]:
    """Every input check of ``simulate`` that needs no run: (node order, faults outside the job)."""
    _check(cl, wl, nodes=nodes, steps=steps, seed=seed)
    names = link_names(cl, nodes)
    named = {s.link for s in nz.spec.links} | {n for f in nz.spec.foreign for n in f.links}
    # The whole cluster's links are named only when a fault names a link this job does not use: on a
    # cluster file of 10^6 nodes that takes 1.7 GB and 10 s, and a study checks every node count.
    all_links = link_names(cl, cl.nodes) if named - set(names or ()) else None
    outside = nz.validate_against(
        world=nodes * cl.gpus_per_node,
        nodes=nodes,
        links=names,
        cluster_links=all_links,
        cluster_nodes=cl.nodes,
    )
    p = wl.spec.parallelism
    order = resolve_node_order(node_order, nodes=nodes, seed=seed)
    if order is not None and (p.pp > 1 or p.tp > 1):
        raise ConfigError(
            f"{wl.source}: a node order other than 'packed' is modelled for data parallelism only "
            "(tp = pp = 1); use --node-order packed"
        )
    return order, outside


def check_job(
    cluster: Any,
    workload: str | Path | Workload,
    noise: str | Path | Noise | None = None,
    *,
    nodes: int,
    steps: int,
    seed: int = 0,
    node_order: str | Sequence[int] | None = None,
) -> None:
    """Raise the ``InputError``/``ConfigError`` that ``simulate`` would raise for these inputs, without
    running anything or touching the disk (a study checks every node count before it starts)."""
    _check_job(
        _load_cluster(cluster),
        load_workload(workload),
        load_noise(noise),
        nodes=nodes,
        steps=steps,
        seed=seed,
        node_order=node_order,
    )


def _max_delay_share(controller: Any) -> float:
    """The comm delay cap of the controller's config (the real pacer's default without one)."""
    from fabricpace.pacing.config import PacingConfig

    config = getattr(controller, "config", None)
    return float(getattr(config, "max_delay_share", PacingConfig().max_delay_share))


NODE_ORDERS = ("packed", "shuffled")


def resolve_node_order(spec: str | Sequence[int] | None, *, nodes: int, seed: int) -> np.ndarray | None:
    """The job's nodes in rank order: None for ``packed`` (node ranks in leaf order, what a
    topology-sorted hostfile gives); ``shuffled`` draws the order from the seed — torchrun's c10d
    rendezvous numbers nodes in the order they join, so without a sorted hostfile the ring visits the
    leaves in no particular order; or an explicit list of node ids 0..nodes-1."""
    if spec is None or (isinstance(spec, str) and spec == "packed"):
        return None
    if isinstance(spec, str):
        if spec != "shuffled":
            raise InputError(f"--node-order {spec!r}: use one of {', '.join(NODE_ORDERS)}")
        return np.random.default_rng([seed, 0x0D]).permutation(nodes)
    order = np.asarray([int(v) for v in spec], dtype=np.int64)
    if sorted(order.tolist()) != list(range(nodes)):
        raise InputError(f"node order: expected each of the node ids 0..{nodes - 1} exactly once")
    return order


def rank_leaves(cluster: Any, *, nodes: int, node_order: np.ndarray | None) -> list[int]:
    """Leaf of every rank of a job launched in ``node_order`` (node rank k on node ``node_order[k]``):
    what a pacing controller is told so that its placement policy can act."""
    g = cluster.gpus_per_node
    node_of = np.arange(nodes) if node_order is None else np.asarray(node_order, dtype=np.int64)
    return [int(cluster.leaf_of(int(node_of[r // g]))) for r in range(nodes * g)]


def _ring_nodes(node_of_rank: np.ndarray, placement: Sequence[int], g: int) -> list[int]:
    """Nodes in the order a ring over the ranks in ``placement`` order visits them (whole nodes)."""
    return [int(v) for v in node_of_rank[np.asarray(placement, dtype=np.int64)][::g]]


def _run_id(*parts: Any) -> str:
    return "sim-" + hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:10]


def _strip(b: BlockResult) -> BlockResult:
    """Drop the big per-collective arrays once recorded (summaries need only per-step ones)."""
    return replace(b, issue=np.empty((0, 0, 0)), end=np.empty((0, 0)))


def simulate(
    cluster: Any,
    workload: str | Path | Workload,
    noise: str | Path | Noise | None = None,
    *,
    nodes: int,
    steps: int,
    seed: int,
    out_dir: str | Path,
    controller: Any = None,
    progress: Callable[[int], None] | None = None,
    options: SimOptions = SimOptions(),
    node_order: str | Sequence[int] | None = None,
) -> Path:
    """Simulate ``steps`` training steps of ``workload`` on ``nodes`` nodes of ``cluster``.

    Returns the run directory. ``progress`` is called with the number of steps just finished.
    ``node_order``: ``packed`` (default), ``shuffled`` or node ids in rank order (``resolve_node_order``).
    Bad input raises ``InputError``/``ConfigError``; an existing non-empty ``out_dir`` is refused.
    """
    cl = _load_cluster(cluster)
    wl = load_workload(workload)
    nz = load_noise(noise)
    order, outside = _check_job(cl, wl, nz, nodes=nodes, steps=steps, seed=seed, node_order=node_order)
    out = check_new_dir(out_dir, what="--out")
    if options.window < 1:
        raise InputError(f"window {options.window}: must be at least 1")
    g = cl.gpus_per_node
    world = nodes * g
    names = link_names(cl, nodes)
    p = wl.spec.parallelism
    dp_nodes = nodes // p.pp
    from fabricpace.sim.engine import step_collectives

    coll = step_collectives(wl)
    transfers = TransferModel(
        cl,
        nodes=dp_nodes,
        gpus_per_node=g // p.tp,
        ops_sizes=coll.keys,
        steps=steps,
        noise=nz,
        seed=seed,
        names=names,
        node_order=None if order is None else order.tolist(),
    )
    engine = Engine(
        workload=wl, noise=nz, transfers=transfers, nodes=nodes, gpus_per_node=g, seed=seed, node_order=order
    )
    state = engine.initial_state()
    pacing_info: dict[str, Any] = {"mode": "off"}
    if controller is not None:
        pacing_info = {"mode": "paced", "controller": type(controller).__name__, "window": options.window}
    elif options.pinned is not None:
        apply_state(
            state, options.pinned, batch=wl.batch_per_gpu, gpus_per_node=g, model_parallel=wl.model_parallel
        )
        if options.pinned.placement is not None and p.pp == 1 and p.tp == 1:
            transfers.reorder(_ring_nodes(state.node_of_rank, options.pinned.placement, g), from_step=0)
        pacing_info = {"mode": "pinned", "state": repr(options.pinned)}
    manifest = Manifest(
        source="sim",
        world_size=world,
        nodes=nodes,
        gpus_per_node=g,
        run_id=_run_id(cl.name, wl.describe(), nz.describe(), nodes, steps, seed, pacing_info),
        workload={**wl.describe(), "model_parallel": wl.model_parallel},
        cluster=cl.model_dump(mode="json"),
        pacing=pacing_info,
        extra={
            "seed": seed,
            "steps": steps,
            "noise": nz.describe(),
            "faults_outside_job": outside,
            "node_order": None if order is None else order.tolist(),
        },
    )
    rec = Recorder(
        out, manifest, ops=coll.ops, sizes=coll.sizes, record_collectives=options.record_collectives
    )
    K = len(coll.ops)
    block = int(np.clip(options.block_elements // max(world * K, 1), 1, options.window))
    window_blocks: list[BlockResult] = []
    extra: dict[str, Any] = {}
    w0, w_index, length = 0, 0, options.window
    while w0 < steps:
        w1 = min(w0 + length, steps)
        window_blocks.clear()
        for b0 in range(w0, w1, block):
            res = engine.run_block(state, np.arange(b0, min(b0 + block, w1)))
            rec.block(res)
            if controller is not None:
                window_blocks.append(_strip(res))
            if progress is not None:
                progress(res.steps.size)
        if controller is not None and w1 < steps:
            summaries = window_summaries(window_blocks, window_index=w_index)
            try:
                new_state, decisions = controller.update(w1, summaries)
                apply_state(
                    state,
                    new_state,
                    batch=wl.batch_per_gpu,
                    gpus_per_node=g,
                    step_time_s=float(np.median([s.step_median_ns for s in summaries])) / 1e9,
                    max_delay_share=_max_delay_share(controller),
                    model_parallel=wl.model_parallel,
                )
                if new_state.placement is not None and p.pp == 1 and p.tp == 1:
                    transfers.reorder(_ring_nodes(state.node_of_rank, new_state.placement, g), from_step=w1)
            except Exception as exc:  # the real layer turns pacing off on any controller error
                from fabricpace.pacing.state import Decision

                apply_state(state, PacingState(), batch=wl.batch_per_gpu, gpus_per_node=g)
                decisions = [
                    Decision(
                        step=w1,
                        rank=-1,
                        policy="guard",
                        action="off",
                        value=0.0,
                        reason=f"controller error: {exc!r}",
                    )
                ]
                extra["pacing_error"] = repr(exc)
                controller = None
            rec.decisions(decisions)
        # The controller may ask for a shorter next window (a rebalance trial's first ON window).
        probe = getattr(controller, "next_window_steps", None) if controller is not None else None
        length = int(probe) if probe else options.window
        w0, w_index = w1, w_index + 1
    leaf = np.asarray([cl.leaf_of(n) for n in range(nodes)], dtype=np.int64)
    rec.ranks(
        node_of_rank=state.node_of_rank,
        gpus_per_node=g,
        leaf_of_node=leaf,
        nics_per_gpu=cl.nics.per == "gpu",
        tp=p.tp,
        pp=p.pp,
        nodes=nodes,
    )
    if transfers.restarts:
        extra["ring_node_order"] = list(transfers.node_order or range(dp_nodes))
    rec.close(**extra)
    return out
