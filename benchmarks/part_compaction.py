"""What merging parts (ObserverConfig.compact_parts) costs the writer and saves the reader.

One rank's writer (the observer's ``ChunkSink``, inline) writes PARTS parts of steps and collectives —
each a flush interval's rows: STEPS steps, COLLS collectives per step — once with merging every K parts
and once without, the two interleaved part by part in two run directories. It prints the files each run
holds, the writer's time per part (median and mean, with the merges, and a bootstrap 95% CI of the
ratio of means), and the time to read the run back (``load_run``, median of 5 interleaved reads).

    .venv/bin/python benchmarks/part_compaction.py                 # 1,024 parts, K = 64
    .venv/bin/python benchmarks/part_compaction.py --parts 256 --k 16 --quick
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import fabricpace
from fabricpace.observe._guard import Guard
from fabricpace.observe.chunks import ChunkSink
from fabricpace.run.manifest import Manifest, write_manifest


def _chunk(part: int, steps: int, colls: int, rng: np.random.Generator) -> dict[str, object]:
    first = part * steps
    t0 = 10**12 + first * 100_000_000
    s = np.zeros((steps, 11), dtype=np.int64)
    s[:, 0] = np.arange(first, first + steps)
    s[:, 1] = t0 + np.arange(steps) * 100_000_000
    s[:, 2] = s[:, 1] + 90_000_000 + rng.integers(0, 5_000_000, steps)
    s[:, 3] = 60_000_000 + rng.integers(0, 5_000_000, steps)
    s[:, 9] = 8
    rows = []
    for i in range(steps):
        for j in range(colls):
            enter = int(s[i, 1]) + 1_000_000 * j
            rows.append((first + i, (first + i) * colls + j, "ddp:world", "all_reduce", 25 << 20, enter,
                         enter + 400_000))
    return {"steps": s, "collectives": rows}


def _bootstrap_ratio(
    a: np.ndarray, b: np.ndarray, rng: np.random.Generator, n: int = 2000
) -> tuple[float, float]:
    idx = rng.integers(0, a.size, (n, a.size))
    r = a[idx].mean(axis=1) / b[idx].mean(axis=1)
    return float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", type=int, default=1024, help="parts per table (default 1,024)")
    ap.add_argument("--k", type=int, default=64, help="merge every K parts (default 64)")
    ap.add_argument("--steps", type=int, default=150, help="steps per part (15 s at 10 steps/s)")
    ap.add_argument("--colls", type=int, default=20, help="collectives per step (DDP buckets)")
    ap.add_argument("--quick", action="store_true", help="fewer reads")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    tmp = Path(tempfile.mkdtemp(prefix="fp-compaction-"))
    try:
        sinks = {}
        for name, k in (("merged", args.k), ("plain", 0)):
            sinks[name] = ChunkSink(tmp / name, 0, Guard(0), threaded=False, compact=k)
        times: dict[str, list[float]] = {"merged": [], "plain": []}
        for p in range(args.parts):
            chunk = _chunk(p, args.steps, args.colls, rng)
            order = ("merged", "plain") if p % 2 == 0 else ("plain", "merged")
            for name in order:
                t = time.perf_counter()
                sinks[name].submit(chunk, 0)
                times[name].append(time.perf_counter() - t)
            if (p + 1) % max(1, args.parts // 8) == 0:
                print(f"  wrote {p + 1}/{args.parts} parts per table", flush=True)
        for name, sink in sinks.items():
            assert sink.guard.failed == {}, sink.guard.failed
            write_manifest(tmp / name, Manifest(source="observer", world_size=1, nodes=1, gpus_per_node=1,
                                                complete=True))
        files = {n: sum(1 for f in (tmp / n).rglob("part-*.parquet")) for n in sinks}
        a, b = np.asarray(times["merged"]), np.asarray(times["plain"])
        lo, hi = _bootstrap_ratio(a, b, rng)
        reads: dict[str, list[float]] = {"merged": [], "plain": []}
        heights = {}
        for i in range(3 if args.quick else 5):
            for name in (("merged", "plain") if i % 2 == 0 else ("plain", "merged")):
                t = time.perf_counter()
                run = fabricpace.load_run(tmp / name)
                reads[name].append(time.perf_counter() - t)
                heights[name] = (run.steps.height, run.collectives.height)
        assert heights["merged"] == heights["plain"], heights
        print(f"\n{args.parts} parts per table, {args.steps} steps x {args.colls} collectives each, "
              f"merged every {args.k}:")
        print(f"  files: merged {files['merged']}, plain {files['plain']} "
              f"({files['plain'] / max(files['merged'], 1):.1f}x fewer)")
        print(f"  writer per part (both tables): merged median {np.median(a) * 1e3:.2f} ms, mean "
              f"{a.mean() * 1e3:.2f} ms; plain median {np.median(b) * 1e3:.2f} ms, "
              f"mean {b.mean() * 1e3:.2f} ms; "
              f"ratio of means {a.mean() / b.mean():.3f} (95% CI {lo:.3f}..{hi:.3f}, n={a.size} parts each)")
        rm, rp = float(np.median(reads["merged"])), float(np.median(reads["plain"]))
        print(f"  load_run: merged {rm:.2f} s, plain {rp:.2f} s (median of {len(reads['merged'])}, "
              f"interleaved); ratio {rm / rp:.2f}; rows {heights['merged']} in both")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
