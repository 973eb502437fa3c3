"""Benchmark: time and peak memory of ``fabricpace report`` on large runs, old code vs new, side by side.

Each measurement is one report written by a fresh process (so its peak RSS, ru_maxrss, covers reading
and every panel). With ``--old-src DIR`` (the ``src`` folder of an older checkout, e.g.
``git archive <sha> src | tar -x -C /tmp/old``) old and new code run on the same run directory,
interleaved (old, new, old, new, ...; the order alternates each round), so load from other processes
hits both alike. Printed: per code version n, median seconds [min, max] and peak RSS; the new/old ratio
of the medians with a bootstrap 95% interval; and whether the HTML is byte-identical between all
reports once the one line that names the time it was generated is set aside.

    .venv/bin/python benchmarks/report_scale.py RUN_DIR --old-src /tmp/old/src --repeats 3
    .venv/bin/python benchmarks/report_scale.py --nodes 64 --steps 300 --old-src /tmp/old/src
        (simulates the paper scenario once under --out first)

``--no-findings`` measures the report without the diagnosis (its own reading only); ``--both``
measures with and without.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
from pathlib import Path

NEW_SRC = Path(__file__).resolve().parents[1] / "src"

CHILD = r"""
import json, resource, sys, time
from fabricpace.report.html import write_report
t = time.perf_counter()
write_report([sys.argv[1]], sys.argv[2], findings=sys.argv[3] == "1")
print(json.dumps({"seconds": time.perf_counter() - t,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

_STAMP = re.compile(rb"generated [0-9-]+ [0-9:]+ UTC")  # the report's one time-dependent line


def _env(src: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(src)}


def _one(src: Path, run: Path, out: Path, findings: bool) -> dict[str, object]:
    out.unlink(missing_ok=True)  # reports never overwrite
    r = subprocess.run(
        ["nice", "-n", "19", sys.executable, "-c", CHILD, str(run), str(out), "1" if findings else "0"],
        capture_output=True, text=True, env=_env(src),
    )
    if r.returncode != 0:
        raise SystemExit(f"report failed ({src}):\n{r.stderr[-2000:]}")
    res: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    res["digest"] = hashlib.sha256(_STAMP.sub(b"generated T", out.read_bytes())).hexdigest()[:12]
    out.unlink()
    return res


def _ratio_ci(new: list[float], old: list[float], n_boot: int = 2000) -> tuple[float, float]:
    """95% bootstrap interval of median(new) / median(old), each side resampled on its own."""
    rng = random.Random(0)
    rs = sorted(
        statistics.median(rng.choices(new, k=len(new))) / statistics.median(rng.choices(old, k=len(old)))
        for _ in range(n_boot)
    )
    return rs[int(0.025 * n_boot)], rs[int(0.975 * n_boot) - 1]


def _simulate(out: Path, nodes: int, steps: int) -> Path:
    path = out / f"paper-{nodes}x{steps}"
    if not (path / "manifest.json").exists():
        subprocess.run(
            [sys.executable, "-m", "fabricpace.cli.app", "simulate", "--scenario", "paper", "--nodes",
             str(nodes), "--steps", str(steps), "--out", str(path), "--format", "json"],
            check=True, capture_output=True, env=_env(NEW_SRC),
        )
    return path


def _rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in (path / "collectives").rglob("*.parquet"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", nargs="*", type=Path, help="run directories (default: simulate --nodes/--steps)")
    ap.add_argument("--old-src", type=Path, default=None, help="src folder of the old code (side by side)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", type=Path, default=Path("/tmp/fabricpace-bench"))
    ap.add_argument("--no-findings", action="store_true", help="report without the diagnosis")
    ap.add_argument("--both", action="store_true", help="with and without findings")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = args.run or [_simulate(args.out, args.nodes, args.steps)]
    versions = [("new", NEW_SRC)] + ([("old", args.old_src.resolve())] if args.old_src else [])
    modes = [True, False] if args.both else [not args.no_findings]
    print(f"{'run':>24} {'coll. rows':>12} {'findings':>8} {'code':>4} {'seconds med [min, max]':>24} "
          f"{'peak RSS MB med [max]':>22} {'n':>2}")
    ratios = []
    for run in runs:
        rows = _rows(run)
        for findings in modes:
            res: dict[str, list[dict[str, object]]] = {v: [] for v, _ in versions}
            for i in range(args.repeats):
                order = versions if i % 2 else versions[::-1]
                for name, src in order:
                    res[name].append(_one(src, run, args.out / f"bench-{name}.html", findings))
            for name, _ in versions:
                t = [float(r["seconds"]) for r in res[name]]  # type: ignore[arg-type]
                m = [float(r["peak_rss_mb"]) for r in res[name]]  # type: ignore[arg-type]
                print(f"{run.name[-24:]:>24} {rows:>12,} {'yes' if findings else 'no':>8} {name:>4} "
                      f"{statistics.median(t):>9.2f} [{min(t):.2f}, {max(t):.2f}]{'':>2} "
                      f"{statistics.median(m):>12.0f} [{max(m):.0f}] {len(t):>2}")
            digests = {str(r["digest"]) for rs in res.values() for r in rs}
            if len(versions) > 1:
                tn = [float(r["seconds"]) for r in res["new"]]  # type: ignore[arg-type]
                to = [float(r["seconds"]) for r in res["old"]]  # type: ignore[arg-type]
                mn = max(float(r["peak_rss_mb"]) for r in res["new"])  # type: ignore[arg-type]
                mo = max(float(r["peak_rss_mb"]) for r in res["old"])  # type: ignore[arg-type]
                lo, hi = _ratio_ci(tn, to)
                ratios.append(
                    f"  {run.name}, findings {'yes' if findings else 'no'}: time new/old "
                    f"×{statistics.median(tn) / statistics.median(to):.2f} (95% CI {lo:.2f}–{hi:.2f}), "
                    f"peak RSS ×{mn / mo:.2f} ({mo:.0f} -> {mn:.0f} MB); HTML "
                    + ("byte-identical (all reports)" if len(digests) == 1 else f"DIFFERS {sorted(digests)}")
                )
    if ratios:
        print("new / old (medians):")
        print("\n".join(ratios))


if __name__ == "__main__":
    main()
