"""Benchmark: time and peak memory of ``diagnose`` (and ``report``) on large runs, old code vs new.

Cases (``--cases``, comma-separated):

* ``syn256`` / ``syn1024``: synthetic (``fabricpace.diagnose.synthetic``) 256 ranks × 500 steps and
  1,024 ranks × 2,000 steps, a slow node and GC noise, two DDP buckets per step (target for 1,024 ×
  2,000: < 30 s, < 4 GB);
* ``paper64``: the simulator's paper scenario on 64 nodes (512 ranks) × 300 steps — the realistic
  bucket count (~200 all-reduce buckets per step: 1.3 B fp32 parameters in 25 MiB buckets), 31 M
  collective rows (target: ≤ 1.5 GB peak RSS, no slower than before);
* ``synB``: synthetic, ``--ranks`` × ``--steps`` with ``--buckets`` buckets per step;
* ``paperX``: the paper scenario on ``--nodes`` nodes × ``--steps`` steps (e.g. 64 × 1,200: 123 M rows,
  more than the old code can hold here — measure it without ``--old-src``);
* ``obs1024`` / ``all1024``: the same rows (synthetic, 1,024 ranks × 200 steps) laid out as the observer
  writes them (``TABLE/rank-NNNNN/part-NNNNNN.parquet``, a part per 50 steps: 8,192 part files) and
  as the synthetic writer does (``TABLE/all/``, one file per table). Every other case uses the
  ``all/`` layout, which hid a cost of 3-5 ms per part file (audit 17 A3: 21-46 s against 2.4-7 s);
  ``obsB`` is ``synB`` in the observer layout;
* ``dir:PATH``: an existing run directory (e.g. one whose steps table has no ``wait_ns``, as imported
  traces: then each rank-step's wait is the union of its collectives' wait intervals).

Each measurement runs in a fresh process, so its peak RSS (ru_maxrss) covers loading and every
detector. With ``--old-src DIR`` (the ``src`` folder of a checkout of an older commit, e.g.
``git worktree add /tmp/old <sha>``), the old and the new code run on the same run directory,
interleaved (old, new, old, new, ...), and both are printed side by side with the new/old ratios.
``--report`` also measures ``fabricpace report`` (HTML with findings) once per code version.

    .venv/bin/python benchmarks/diagnose_scale.py --cases paper64 --repeats 3 --old-src /tmp/old/src
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

NEW_SRC = Path(__file__).resolve().parents[1] / "src"

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from fabricpace.diagnose import diagnose
t1 = time.perf_counter()
d = diagnose([sys.argv[1]]).to_dict()
t2 = time.perf_counter()
print(json.dumps({
    "import_s": t1 - t0, "seconds": t2 - t1,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "modes": sorted({(f["mode"], tuple(f["culprits"]["nodes"])) for f in d["findings"]}),
    "digest": __import__("hashlib").sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12],
}))
"""

REPORT_CHILD = r"""
import json, resource, sys, time
from fabricpace.report.html import write_report
t = time.perf_counter()
write_report([sys.argv[1]], sys.argv[2])
print(json.dumps({"seconds": time.perf_counter() - t,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def make_synthetic(out: Path, ranks: int, steps: int, buckets: int) -> Path:
    from fabricpace.diagnose.synthetic import SynthSpec, write_synthetic

    path = out / f"diag-{ranks}x{steps}x{buckets}"
    if (path / "manifest.json").exists():
        return path
    t = time.perf_counter()
    spec = SynthSpec(
        ranks=ranks,
        gpus_per_node=8,
        nodes_per_leaf=16,
        steps=steps,
        buckets=buckets,
        slow_ranks=tuple(range(40, 48)),
        slow_factor=1.3,
        gc_prob=0.001,
        gc_ms=20,
        seed=1,
    )
    write_synthetic(path, spec)
    print(f"generated {path} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return path


def make_observer_layout(src: Path, part_steps: int = 50) -> Path:
    """``src`` (tables in ``TABLE/all/``) rewritten as an observer writes it: a folder per rank and a
    part per ``part_steps`` steps, numbered from 0, rows in (step) order within each rank."""
    import shutil

    import numpy as np
    import pyarrow.parquet as pq

    path = src.with_name(src.name + f"-obs{part_steps}")
    if (path / "manifest.json").exists():
        return path
    t0 = time.perf_counter()
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("all", "diagnosis.json", "manifest.json"))
    for table in ("steps", "collectives"):
        t = pq.read_table(src / table / "all").sort_by([("rank", "ascending"), ("step", "ascending")])
        ranks, steps = t.column("rank").to_numpy(), t.column("step").to_numpy()
        starts = np.r_[0, np.flatnonzero(np.diff(ranks) != 0) + 1]
        ends = np.r_[starts[1:], len(ranks)]
        for a, b in zip(starts, ends, strict=True):
            folder = tmp / table / f"rank-{int(ranks[a]):05d}"
            folder.mkdir(parents=True)
            cuts = np.r_[0, np.flatnonzero(np.diff(steps[a:b] // part_steps) != 0) + 1, b - a]
            for k in range(len(cuts) - 1):
                pq.write_table(t.slice(a + cuts[k], cuts[k + 1] - cuts[k]), folder / f"part-{k:06d}.parquet")
    shutil.copy2(src / "manifest.json", tmp / "manifest.json")  # last: a complete copy
    tmp.rename(path)
    print(f"relaid {path} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return path


def make_paper(out: Path, nodes: int, steps: int) -> Path:
    path = out / f"paper-{nodes}x{steps}"
    if (path / "manifest.json").exists():
        return path
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "fabricpace.cli.app", "simulate", "--scenario", "paper", "--nodes", str(nodes),
         "--steps", str(steps), "--out", str(path), "--format", "json"],
        check=True, capture_output=True, env=_env(NEW_SRC),
    )
    print(f"simulated {path} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return path


def _env(src: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(src)}


def _child(code: str, args: list[str], src: Path) -> dict[str, object]:
    r = subprocess.run(
        ["nice", "-n", "19", sys.executable, "-c", code, *args],
        capture_output=True, text=True, env=_env(src),
    )
    if r.returncode != 0:
        raise SystemExit(f"child failed ({src}):\n{r.stderr[-2000:]}")
    out: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def _rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in (path / "collectives").rglob("*.parquet"))


def _summary(runs: list[dict[str, object]]) -> dict[str, float]:
    t = [float(r["seconds"]) for r in runs]  # type: ignore[arg-type]
    m = [float(r["peak_rss_mb"]) for r in runs]  # type: ignore[arg-type]
    return {"s_med": statistics.median(t), "s_min": min(t), "s_max": max(t),
            "mb_med": statistics.median(m), "mb_max": max(m), "n": len(runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="syn256,syn1024,paper64")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("/tmp/fabricpace-bench"))
    ap.add_argument("--old-src", type=Path, default=None, help="src folder of the old code (side by side)")
    ap.add_argument("--report", action="store_true", help="also measure fabricpace report (HTML)")
    ap.add_argument("--ranks", type=int, default=512)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--buckets", type=int, default=200)
    ap.add_argument("--nodes", type=int, default=64)  # the paper cluster has 64 nodes
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    makers = {
        "syn256": lambda: make_synthetic(args.out, 256, 500, 2),
        "syn1024": lambda: make_synthetic(args.out, 1024, 2000, 2),
        "paper64": lambda: make_paper(args.out, 64, 300),
        "synB": lambda: make_synthetic(args.out, args.ranks, args.steps, args.buckets),
        "paperX": lambda: make_paper(args.out, args.nodes, args.steps),
        "all1024": lambda: make_synthetic(args.out, 1024, 200, 2),
        "obs1024": lambda: make_observer_layout(make_synthetic(args.out, 1024, 200, 2)),
        "obsB": lambda: make_observer_layout(make_synthetic(args.out, args.ranks, args.steps, args.buckets)),
    }
    versions = [("new", NEW_SRC)] + ([("old", args.old_src.resolve())] if args.old_src else [])
    table: list[tuple[str, int, str, str, dict[str, float], object, bool | None]] = []
    for case in args.cases.split(","):
        path = Path(case[4:]) if case.startswith("dir:") else makers[case]()
        rows = _rows(path)
        runs: dict[str, list[dict[str, object]]] = {v: [] for v, _ in versions}
        for _ in range(args.repeats):  # interleaved, so load from other processes hits both alike
            for name, src in reversed(versions):
                runs[name].append(_child(CHILD, [str(path)], src))
        digests = {name: {str(r["digest"]) for r in rs} for name, rs in runs.items()}
        same = len(set().union(*digests.values())) == 1
        for name, _ in versions:
            table.append((case, rows, "diagnose", name, _summary(runs[name]), runs[name][0]["modes"], same))
        if args.report:
            for name, _ in versions:  # its own output of an earlier run (reports never overwrite)
                (args.out / f"{case}-{name}.html").unlink(missing_ok=True)
            rep = {name: [_child(REPORT_CHILD, [str(path), str(args.out / f"{case}-{name}.html")], src)]
                   for name, src in reversed(versions)}
            for name, _ in versions:
                table.append((case, rows, "report", name, _summary(rep[name]), "", None))
    print(f"{'case':>8} {'coll. rows':>12} {'what':>8} {'code':>4} {'seconds med [min, max]':>24} "
          f"{'peak RSS MB (max)':>18} {'n':>2}  result")
    for case, rows, what, name, s, modes, ident in table:
        res = ""
        if len(versions) > 1 and ident is not None:
            res = "JSON identical old/new" if ident else "JSON DIFFERS old/new"
        spread = f"{s['s_med']:>9.2f} [{s['s_min']:.2f}, {s['s_max']:.2f}]"
        print(f"{case:>8} {rows:>12,} {what:>8} {name:>4} {spread}{'':>2} {s['mb_max']:>18.0f} {s['n']:>2}  "
              f"{res} {modes if name == 'new' else ''}")
    if len(versions) > 1:
        print("new / old (medians):")
        by = {(c, w, n): s for c, _r, w, n, s, _m, _s in table}
        for case, _r, what, name, s, _m, _s in table:
            if name == "new" and (case, what, "old") in by:
                o = by[(case, what, "old")]
                mb = f"({o['mb_max']:.0f} -> {s['mb_max']:.0f} MB)"
                print(f"  {case:>8} {what:>8}: time ×{s['s_med'] / o['s_med']:.2f}, "
                      f"peak RSS ×{s['mb_max'] / o['mb_max']:.2f} {mb}")


if __name__ == "__main__":
    main()
