"""Pacing in the simulator: baseline vs paced on the `paper` scenario and on other noise scenarios.

    .venv/bin/python benchmarks/pacing_sim.py                    # paper + 4 other scenarios
    .venv/bin/python benchmarks/pacing_sim.py --only paper --repeats 3

Runs ``fabricpace study --backend sim --compare baseline,paced`` (the same controller and guard as
on real ranks, applied through the simulator's actuator twins) and prints, per scenario and node
count, the throughput change of paced vs baseline as the mean of paired differences (repeat i uses
the same seed in both modes) with its 95% CI, and the CV of iteration time in both modes.
The scenarios besides `paper` are written here on the fly (they are not shipped with fabricpace):
they check that pacing helps where its failure mode is present and never hurts beyond noise elsewhere.
Nothing in the simulator or the scenarios is tuned for pacing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "src/fabricpace/data/scenarios/paper"

# Other noise scenarios on the paper's cluster and workload (YAML as `--noise` files).
NOISE: dict[str, str] = {
    "healthy": "name: healthy\njitter: {cv: 0.02, distribution: normal}\n",
    "gc-heavy": (
        "name: gc-heavy\njitter: {cv: 0.02, distribution: normal}\n"
        "gc: {garbage_mb_per_step: 20, garbage_cv: 0.3, threshold_mb: 400, threshold_cv: 0.1,\n"
        "     pause_ms_base: 5, pause_ms_per_mb: 0.1, baseline_rss_mb: 6000}\n"
    ),
    "slow-rank": (
        "name: slow-rank\njitter: {cv: 0.02, distribution: normal}\nslow:\n  - {rank: 3, factor: 1.3}\n"
    ),
    "host-pauses": (
        "name: host-pauses\njitter: {cv: 0.03, distribution: normal}\n"
        "pauses: {rate_hz: 2.0, duration_ms: 5, duration_cv: 1.0}\n"
    ),
}


def study(args: list[str]) -> dict[str, Any]:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "fabricpace.cli.app",
            "study",
            "--backend",
            "sim",
            "--compare",
            "baseline,paced",
            "--no-figures",
            "--format",
            "json",
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        raise RuntimeError(f"study failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return dict(json.loads(r.stdout))


def rows_by_nodes(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = result["rows"]
    base = {r["nodes"]: r for r in rows if r["mode"] == "baseline"}
    out = []
    for r in rows:
        if r["mode"] != "paced":
            continue
        b = base[r["nodes"]]
        out.append(
            {
                "nodes": r["nodes"],
                "baseline": b["throughput"],
                "paced": r["throughput"],
                "delta_pct": r.get("delta_pct"),
                "delta_ci_pct": r.get("delta_ci_pct"),
                "cv_baseline": b["cv"],
                "cv_paced": r["cv"],
            }
        )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", help="scenario(s) to run: paper or a name from NOISE")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--nodes", default="4,8,16")
    ap.add_argument("--json", default="", help="also write the results here")
    args = ap.parse_args(argv)
    names = args.only or ["paper", *NOISE]
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="fp-pacing-sim-") as tmp:
        for name in names:
            out = Path(tmp) / name
            common = ["--repeats", str(args.repeats), "--nodes", args.nodes, "--out", str(out)]
            if name == "paper":
                res = study(["--scenario", "paper", *common])
            else:
                noise = Path(tmp) / f"{name}.yaml"
                noise.write_text(NOISE[name])
                res = study(
                    [
                        "--cluster",
                        str(PAPER / "cluster.yaml"),
                        "--workload",
                        str(PAPER / "workload.yaml"),
                        "--noise",
                        str(noise),
                        "--steps",
                        "300",
                        "--warmup",
                        "50",
                        *common,
                    ]
                )
            results[name] = rows_by_nodes(res)
            for row in results[name]:
                ci = row["delta_ci_pct"] or [float("nan"), float("nan")]
                d = row["delta_pct"] if row["delta_pct"] is not None else float("nan")
                print(
                    f"{name:12s} {row['nodes']:3d} nodes  baseline {row['baseline']:8.1f}  paced "
                    f"{row['paced']:8.1f}  Δ {d:+.2f}% (95% CI {ci[0]:+.2f}..{ci[1]:+.2f})  "
                    f"CV {row['cv_baseline']:.3f} -> {row['cv_paced']:.3f}",
                    flush=True,
                )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
