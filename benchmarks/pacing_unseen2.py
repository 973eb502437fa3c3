"""Pacing on hand-written scenario folders (benchmarks/scenarios_unseen2), run through the real CLI.

    .venv/bin/python benchmarks/pacing_unseen2.py                       # every folder (~20-30 min, niced)
    .venv/bin/python benchmarks/pacing_unseen2.py --only t0 --only p05  # names starting t0 or p05
    .venv/bin/python benchmarks/pacing_unseen2.py --snapshot            # on a copy of src/ at HEAD
    .venv/bin/python benchmarks/pacing_unseen2.py --keep /tmp/u2 --json /tmp/u2.json --decisions

Issue 6 asks that pacing "never make things worse beyond noise" on simulated scenarios outside the
repository. The folders under ``benchmarks/scenarios_unseen2/`` were written the way an outside
ML-infra engineer would write them, without reading the pacing controller: preset and hand-made
clusters, DDP / FSDP / TP x PP workloads with 1 to 256 samples per GPU, healthy runs, jitter, GC of
several strengths, slow ranks and nodes (1.03x to 3x), faults that start and stop at round step numbers
(0-50, 100-150, 100-200, 150-250, ...), slow and flapping links, foreign tenants, host pauses, and
mixes of them, at 4 to 32 nodes, 100 to 600 steps, windows of 20, 50 and 100 steps. Each folder runs
as a user would run it::

    nice -n 19 fabricpace study --scenario DIR --compare baseline,paced --format json --no-figures \
        --out OUT/NAME [extra options from DIR/study-args.txt, e.g. --window 20]

The study's JSON gives, per node count, the paired throughput change (``delta_pct`` with its Student-t
95% CI over repeats that share seeds). The paired CV change is computed here from ``study.json``'s
points. Verdicts: "WORSE" when the throughput CI lies entirely below 0, "better" when entirely above,
else "no change"; "CV WORSE" when the paired CV CI lies entirely above +0.001. For every WORSE row the
paced runs' ``pacing.parquet`` decisions are printed (step, policy/action, value, reason), so the
decision that cost throughput can be named. A crash (exit code other than 0, a traceback, stdout that
is not one JSON document, ``manifest.extra.pacing_error``) is reported as such.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pacing_stress import reexec_on_snapshot

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "benchmarks" / "scenarios_unseen2"
# The CLI of the Python running this script (any virtualenv; honours PYTHONPATH, as --snapshot needs).
FABRICPACE = [sys.executable, "-m", "fabricpace.cli.app"]
CV_FLOOR = 0.001  # smallest paired CV change called a finding (as pacing_stress.py / pacing_sim.py)
_T975 = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23]  # Student-t, df 1..10


def _mean_ci(x: np.ndarray) -> tuple[float, float, float]:
    m = float(x.mean())
    if x.size < 2:
        return m, math.nan, math.nan
    half = _T975[min(x.size - 2, len(_T975) - 1)] * float(x.std(ddof=1)) / math.sqrt(x.size)
    return m, m - half, m + half


def run_study(folder: Path, out: Path, extra: list[str]) -> dict[str, Any]:
    """One study through the CLI; returns the exit code, the parsed JSON and any problem seen."""
    cmd = ["nice", "-n", "19", *FABRICPACE, "study", "--scenario", str(folder), "--compare",
           "baseline,paced", "--format", "json", "--no-figures", "--out", str(out), *extra]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    res: dict[str, Any] = {"cmd": " ".join(shlex.quote(c) for c in cmd), "rc": p.returncode,
                           "wall_s": time.perf_counter() - t0, "problems": []}
    if "Traceback" in p.stderr:
        res["problems"].append("traceback on stderr")
    if p.returncode != 0:
        tail = [ln for ln in p.stderr.splitlines() if ln.strip()]
        res["problems"].append(f"exit code {p.returncode}: {tail[-1] if tail else '(no stderr)'}")
    else:
        try:
            res["json"] = json.loads(p.stdout)
        except json.JSONDecodeError as exc:
            res["problems"].append(f"stdout is not one JSON document ({exc})")
    return res


def decisions(run_dir: Path) -> list[tuple[int, str, str, float, str]]:
    """The distinct decisions of one paced run: (step, policy, action, value, reason)."""
    import polars as pl

    f = run_dir / "pacing.parquet"
    if not f.exists():
        return []
    dec = pl.read_parquet(f).unique(subset=["step", "policy", "action", "reason"], maintain_order=True)
    dec = dec.sort("step", maintain_order=True)
    return [tuple(r) for r in dec.select("step", "policy", "action", "value", "reason").iter_rows()]  # type: ignore[misc]


def analyse(res: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    """One row per node count: Δ throughput (the study's), paired Δ CV, verdicts, decisions."""
    study = json.loads((out / "study.json").read_text())
    pts = study["points"]
    rows = []
    for r in res["json"]["rows"]:
        if r["mode"] != "paced":
            continue
        n = r["nodes"]
        base = next(x for x in res["json"]["rows"] if x["nodes"] == n and x["mode"] == "baseline")
        b = {p["repeat"]: p for p in pts if p["nodes"] == n and p["mode"] == "baseline"}
        q = {p["repeat"]: p for p in pts if p["nodes"] == n and p["mode"] == "paced"}
        reps = sorted(set(b) & set(q))
        cv_m, cv_lo, cv_hi = _mean_ci(np.array([q[i]["cv"] - b[i]["cv"] for i in reps]))
        lo, hi = r["delta_ci_pct"] if r["delta_ci_pct"] else (math.nan, math.nan)
        dec: dict[int, list[Any]] = {}
        errors = []
        for i in reps:
            run_dir = Path(q[i]["run_dir"])
            man = json.loads((run_dir / "manifest.json").read_text())
            if man.get("extra", {}).get("pacing_error"):
                errors.append(f"r{i}: pacing_error {man['extra']['pacing_error']}")
            dec[i] = decisions(run_dir)
        policies = sorted({f"{d[1]}/{d[2]}" for ds in dec.values() for d in ds})
        rows.append({
            "nodes": n, "repeats": len(reps), "base": base["throughput"], "paced": r["throughput"],
            "delta_pct": r["delta_pct"], "delta_lo": lo, "delta_hi": hi,
            "per_repeat_pct": [100 * (q[i]["throughput"] / b[i]["throughput"] - 1) for i in reps],
            "cv_base": base["cv"], "cv_paced": r["cv"], "cv_delta": cv_m, "cv_lo": cv_lo, "cv_hi": cv_hi,
            "verdict": "better" if lo > 0 else "WORSE" if hi < 0 else "no change",
            "cv_verdict": "CV WORSE" if cv_lo > CV_FLOOR else "CV lower" if cv_hi < -CV_FLOOR else "",
            "policies": policies, "decisions": {str(k): v for k, v in dec.items()}, "errors": errors,
        })
    return rows


def md_row(name: str, r: dict[str, Any]) -> str:
    v = r["verdict"] + (f", {r['cv_verdict']}" if r["cv_verdict"] else "")
    return (f"| {name} | {r['nodes']} | {r['base']:.1f} | {r['delta_pct']:+.2f}% "
            f"[{r['delta_lo']:+.2f}, {r['delta_hi']:+.2f}] | {r['cv_base']:.3f} → {r['cv_paced']:.3f} "
            f"({r['cv_delta']:+.4f} [{r['cv_lo']:+.4f}, {r['cv_hi']:+.4f}]) | **{v}** | "
            f"{', '.join(r['policies']) or '—'} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="run folders whose name starts with this")
    ap.add_argument("--dir", type=Path, default=SCENARIOS, help="folder of scenario folders")
    ap.add_argument("--keep", type=Path,
                    help="write the studies here and keep them (default: a temporary folder, each study "
                         "removed once read: all 104 take ~4 GB)")
    ap.add_argument("--json", type=Path, help="also write every row as JSON here")
    ap.add_argument("--repeats", type=int, help="override every scenario's repeats")
    ap.add_argument("--seed", type=int, help="study --seed (seed of repeat 0; default the CLI's, 1)")
    ap.add_argument("--window", type=int, help="override every scenario's --window")
    ap.add_argument("--decisions", action="store_true", help="print the decisions of every paced run")
    ap.add_argument("--snapshot", nargs="?", const="HEAD", help="run on a copy of src/ at REV (HEAD)")
    args = ap.parse_args(argv)
    if args.snapshot and not os.environ.get("FP_UNSEEN2_SNAPSHOT"):
        given = list(argv or sys.argv[1:])
        at = next(i for i, a in enumerate(given) if a.startswith("--snapshot"))
        has_rev = given[at] == "--snapshot" and at + 1 < len(given) and not given[at + 1].startswith("-")
        skip = 2 if has_rev else 1
        rest = given[:at] + given[at + skip :]
        reexec_on_snapshot(args.snapshot, rest, script=__file__, env_key="FP_UNSEEN2_SNAPSHOT")
    folders = sorted(d for d in args.dir.iterdir() if (d / "scenario.yaml").is_file())
    if args.only:
        folders = [d for d in folders if any(d.name.startswith(s) for s in args.only)]
    keep = args.keep or Path(tempfile.mkdtemp(prefix="fp-unseen2-"))
    keep.mkdir(parents=True, exist_ok=True)
    version = os.environ.get("FP_UNSEEN2_SNAPSHOT") or "working tree"
    print(f"# pacing on {len(folders)} unseen scenarios (code: {version}; studies in {keep})",
          file=sys.stderr)
    table = ["| scenario | nodes | baseline samples/s | Δ throughput [95% CI] | CV base → paced (Δ [CI]) "
             "| verdict | decisions seen |", "|---|---|---|---|---|---|---|"]
    everything: list[dict[str, Any]] = []
    worse: list[tuple[str, dict[str, Any]]] = []
    for k, folder in enumerate(folders):
        out = keep / folder.name
        if out.exists():
            print(f"[{k + 1}/{len(folders)}] {folder.name}: {out} exists, skipped", file=sys.stderr)
            continue
        args_file = folder / "study-args.txt"
        extra = args_file.read_text().split() if args_file.is_file() else []
        if args.repeats:
            extra += ["--repeats", str(args.repeats)]
        if args.seed is not None:
            extra += ["--seed", str(args.seed)]
        if args.window:
            drop = {i for i, x in enumerate(extra) if x == "--window"}
            extra = [x for i, x in enumerate(extra) if i not in drop and i - 1 not in drop]
            extra += ["--window", str(args.window)]
        res = run_study(folder, out, extra)
        rows = analyse(res, out) if "json" in res else []
        for r in rows:
            line = md_row(folder.name + (f" `{' '.join(extra)}`" if extra else ""), r)
            table.append(line)
            print(line, flush=True)
            if r["verdict"] == "WORSE" or r["cv_verdict"] == "CV WORSE" or r["errors"]:
                worse.append((folder.name, r))
            if args.decisions:
                for rep, ds in r["decisions"].items():
                    for s, pol, act, val, why in ds:
                        print(f"    r{rep} {s:5d} {pol}/{act} {val:+.4g}  {why}")
        for p in res["problems"]:
            line = f"| {folder.name} | — | — | CRASH: {p} | — | **crash** | — |"
            table.append(line)
            print(line, flush=True)
        print(f"[{k + 1}/{len(folders)}] {folder.name}: {res['wall_s']:.0f} s", file=sys.stderr, flush=True)
        everything.append({"scenario": folder.name, "cmd": res["cmd"], "rc": res["rc"],
                           "wall_s": res["wall_s"], "problems": res["problems"], "rows": rows})
        if args.keep is None:
            shutil.rmtree(out, ignore_errors=True)
    if args.keep is None:
        shutil.rmtree(keep, ignore_errors=True)
    print("\n".join(table))
    if worse:
        print("\n## WORSE rows: decisions of the paced runs")
        for name, r in worse:
            print(f"\n{name} at {r['nodes']} nodes: {r['delta_pct']:+.2f}% "
                  f"[{r['delta_lo']:+.2f}, {r['delta_hi']:+.2f}], "
                  f"per repeat {', '.join(f'{x:+.2f}' for x in r['per_repeat_pct'])}; {r['cv_verdict']} "
                  f"{' '.join(r['errors'])}")
            for rep, ds in r["decisions"].items():
                print(f"  r{rep}: " + ("no decisions" if not ds else ""))
                for s, pol, act, val, why in ds:
                    print(f"    {s:5d} {pol}/{act} {val:+.4g}  {why}")
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1, default=str))


if __name__ == "__main__":
    main()
