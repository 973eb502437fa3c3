"""Benchmark: diagnose 1,024 ranks × 2,000 steps of telemetry (target: < 30 s, < 4 GB peak RSS).

The run directory is synthetic (``fabricpace.diagnose.synthetic``): 128 nodes × 8 ranks, a slow node and
GC noise, two DDP buckets per step — 2,048,000 step rows and 4,096,000 collective rows. Each diagnosis
runs in a fresh process, so its peak RSS (ru_maxrss) covers loading the Parquet chunks and every
detector; it is repeated and the median, min and max are printed. A smaller size is measured side by
side to show how time and memory grow with the data.

    .venv/bin/python benchmarks/diagnose_scale.py [--repeats 3] [--out /tmp/fabricpace-bench]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from fabricpace.diagnose import diagnose
t1 = time.perf_counter()
d = diagnose([sys.argv[1]]).to_dict()
t2 = time.perf_counter()
print(json.dumps({
    "import_s": t1 - t0, "diagnose_s": t2 - t1,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "modes": sorted({(f["mode"], tuple(f["culprits"]["nodes"])) for f in d["findings"]}),
}))
"""


def make_run(out: Path, ranks: int, steps: int) -> Path:
    from fabricpace.diagnose.synthetic import SynthSpec, write_synthetic

    path = out / f"diag-{ranks}x{steps}"
    if (path / "manifest.json").exists():
        return path
    t = time.perf_counter()
    spec = SynthSpec(
        ranks=ranks,
        gpus_per_node=8,
        nodes_per_leaf=16,
        steps=steps,
        slow_ranks=tuple(range(40, 48)),
        slow_factor=1.3,
        gc_prob=0.001,
        gc_ms=20,
        seed=1,
    )
    write_synthetic(path, spec)
    print(f"generated {path} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return path


def measure(path: Path, repeats: int) -> dict[str, object]:
    runs = []
    for _ in range(repeats):
        r = subprocess.run(
            [sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, check=True
        )
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    times = [r["diagnose_s"] for r in runs]
    rss = [r["peak_rss_mb"] for r in runs]
    return {
        "diagnose_s_median": statistics.median(times),
        "diagnose_s_min": min(times),
        "diagnose_s_max": max(times),
        "peak_rss_mb_median": statistics.median(rss),
        "peak_rss_mb_max": max(rss),
        "findings": runs[0]["modes"],
        "repeats": repeats,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("/tmp/fabricpace-bench"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = [(256, 500), (1024, 2000)]
    results = {}
    for ranks, steps in sizes:
        path = make_run(args.out, ranks, steps)
        results[(ranks, steps)] = measure(path, args.repeats)
    head = f"{'ranks x steps':>15} {'rows (steps+coll)':>18} {'diagnose s (med [min,max])':>28}"
    print(f"{head} {'peak RSS MB':>12}  findings")
    for (ranks, steps), r in results.items():
        rows = ranks * steps * 3
        print(
            f"{ranks:>6} x {steps:<6} {rows:>18,} {r['diagnose_s_median']:>10.2f} "
            f"[{r['diagnose_s_min']:.2f}, {r['diagnose_s_max']:.2f}]{'':>6} {r['peak_rss_mb_max']:>12.0f}  "
            f"{r['findings']}"
        )
    small, big = results[sizes[0]], results[sizes[1]]
    ratio_rows = (sizes[1][0] * sizes[1][1]) / (sizes[0][0] * sizes[0][1])
    print(
        f"data ×{ratio_rows:.0f} -> time ×{big['diagnose_s_median'] / small['diagnose_s_median']:.1f}, "
        f"peak RSS ×{big['peak_rss_mb_max'] / small['peak_rss_mb_max']:.1f}"
    )
    ok_t = big["diagnose_s_median"] < 30
    ok_m = big["peak_rss_mb_max"] < 4096
    print(
        f"1024 x 2000: {big['diagnose_s_median']:.1f} s (target < 30 s: {'met' if ok_t else 'MISSED'}), "
        f"peak {big['peak_rss_mb_max']:.0f} MB (target < 4096 MB: {'met' if ok_m else 'MISSED'})"
    )


if __name__ == "__main__":
    main()
