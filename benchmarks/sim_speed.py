"""Simulator speed: simulated GPU-steps per second at the issue's two target scales.

Targets (issue 3): 16 nodes × 8 GPUs × 1,000 steps in under 10 s; 1,024 nodes × 8 GPUs × 100 steps in
under 120 s — on this 2-core machine, shared with other work, so each case prints its wall time, the
GPU-steps/s and how the time splits between the engine and writing the run directory. Not a pass/fail
test. Usage: ``python benchmarks/sim_speed.py [--quick] [--workload NAME ...]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from fabricpace.sim import simulate


def _dir_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def run_case(cluster: str, workload: str, nodes: int, steps: int, noise: str | None) -> dict[str, float]:
    from fabricpace.fabric import load_cluster

    cl = load_cluster(cluster)
    if cl.nodes < nodes:  # same fabric design, more leaves
        cl = cl.model_copy(update={"nodes": nodes})
    tmp = Path(tempfile.mkdtemp(prefix="fp-simspeed-"))
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        out = simulate(cl, workload, noise, nodes=nodes, steps=steps, seed=1, out_dir=tmp / "run")
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        size = _dir_mb(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    gpus = nodes * 8
    return {"wall_s": wall, "cpu_s": cpu, "gpu_steps_per_s": gpus * steps / wall, "mb": size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="only the 16-node case")
    ap.add_argument(
        "--workload",
        nargs="+",
        default=["paper", "gpt-1.3b", "resnet-50"],
        help="workload presets or files; 'paper' = the paper scenario's workload",
    )
    ap.add_argument("--cluster", default=None, help="cluster (default: the paper scenario's, enlarged)")
    ap.add_argument("--noise", default=None, help="noise file (default: the paper scenario's)")
    args = ap.parse_args()
    from fabricpace.study.scenario import load_scenario

    paper = load_scenario("paper")
    noise = args.noise if args.noise is not None else paper.noise
    if args.cluster is None:
        args.cluster = paper.cluster
    cases = [(16, 1000, 10.0)] + ([] if args.quick else [(1024, 100, 120.0)])
    # warm the imports (polars, pyarrow, pandas via pyarrow) so the first case is not charged for them
    run_case(args.cluster, "resnet-50", 1, 5, None)
    print(f"cluster {args.cluster}, noise {noise}")
    # The machine is shared: the load average says how much the wall times are inflated; CPU seconds
    # (this process) are what the simulator itself needed.
    print(f"load average at start: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    print(
        f"{'workload':<12} {'nodes':>6} {'GPUs':>6} {'steps':>6} {'wall s':>8} {'CPU s':>7} {'target s':>8} "
        f"{'GPU-steps/s':>12} {'run dir MB':>10}"
    )
    for name in args.workload:
        wl = paper.workload if name == "paper" else name
        for nodes, steps, target in cases:
            r = run_case(args.cluster, wl, nodes, steps, noise)
            verdict = "ok" if r["wall_s"] < target else "MISSED (wall)"
            print(
                f"{name:<12} {nodes:>6} {nodes * 8:>6} {steps:>6} {r['wall_s']:>8.1f} {r['cpu_s']:>7.1f} "
                f"{target:>8.0f} "
                f"{r['gpu_steps_per_s']:>12,.0f} {r['mb']:>10.1f}  {verdict}",
                flush=True,
            )


if __name__ == "__main__":
    main()
