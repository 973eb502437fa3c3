"""fabricpace diagnose: name the failure mode, the culprit and the evidence for one or more run dirs.

Prints a rich table (``--format text``) or the JSON of DESIGN.md (``--format json``, stdout only), and
writes each run's part to RUN_DIR/diagnosis.json atomically (temp file + rename).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import typer

from fabricpace._errors import InputError
from fabricpace.cli._common import count


def _write_atomic(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(payload, indent=2))
        os.replace(tmp, path)
    except OSError as exc:  # a read-only run directory keeps its data; the result was still printed
        tmp.unlink(missing_ok=True)
        print(f"fabricpace: warning: could not write {path} ({exc})", file=sys.stderr)


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}%"


def _severity(f: dict[str, Any]) -> str:
    """The severity; the what-if beside it only where the two differ (no detector makes them differ
    today: each severity is its what-if saving)."""
    sev, what = f["severity_pct"], f.get("what_if_saving_pct")
    if what is None or sev is None or abs(what - sev) < 0.05:
        return _pct(sev)
    return f"{_pct(sev)}\nwhat-if {_pct(what)}"


def _evidence_line(f: dict[str, Any]) -> str:
    ev = f["evidence"]
    mode = f["mode"]
    parts: list[str] = []
    if mode == "persistent_straggler" or (mode == "input_stall" and ev.get("scope") == "ranks"):
        onset = ev.get("onset") or {}
        win = ev.get("step_window")
        of = f"of steps {win[0]}..{win[1]}" if onset and win else "of steps"
        if onset:  # a straggler of part of the run (onset.py)
            parts.append(f"{'from' if onset['kind'] == 'starts' else 'until'} step {onset['step']}")
        parts.append(
            f"last arriver {ev['last_arriver_share']:.0%} {of} (expected "
            f"{ev['last_arriver_share_expected']:.0%})"
        )
        parts.append(_lateness(ev))
        parts.append(f"cause: {ev['cause']}")
        loc = ev.get("shared_locality")
        if loc:
            parts.append(f"shared {loc['attribute']}: {', '.join(map(str, loc['values']))}")
    elif mode == "sync_amplification":
        parts.append(f"skew {ev['skew_share_of_step']:.1%} of step")
        parts.append(
            f"slowest rank changes: {ev['distinct_slowest_ranks']} ranks, "
            f"top {ev['slowest_rank_top_share']:.0%}"
        )
        robust = ev.get("step_cv_robust")
        if ev.get("one_off_stalls") and robust is not None:  # the CV is the stall's: the spread beside it
            parts.append(f"step CV {ev['step_cv']:.3f} (robust {robust:.3f})")
        else:
            parts.append(f"step CV {ev['step_cv']:.3f}")
        made = ev.get("variation_made_of") or {}
        if made:
            top = max(made, key=lambda k: made[k])
            parts.append(f"mostly {top} ({made[top]:.0%})")
        if ev.get("left_out_of_loss"):
            parts.append("culprits below the straggler threshold left out (note above)")
    elif mode == "topology_contention":
        parts.append(f"transfer ×{ev['transfer_inflation_median']:.2f} vs {ev['transfer_baseline']}")
        parts.append(ev.get("concentrated", ""))
        order = ev.get("ring_leaf_crossings")
        if order:
            parts.append(f"rank order crosses leaves {order['crossings']}x per ring (min {order['minimum']})")
        for p in (ev.get("periods") or [])[:2]:
            per = p.get("excess_ms_per_step")
            parts.append(
                f"steps {p['first_step']}–{p['last_step']}"
                + (
                    f" (+{per:.2f} ms/step, {p['excess_share_of_period']:.0%} of those steps)"
                    if per is not None
                    else ""
                )
            )
        if ev.get("links_unknown"):
            parts.append(str(ev["links_unknown"]))
    elif mode == "input_stall":
        parts.append(f"data wait {ev['data_share_of_step']:.1%} of step on {ev['ranks_stalled']} ranks")
    elif mode == "stage_imbalance":
        parts.append(f"slow stage +{ev['slow_stage_excess_over_median_stage']:.0%} work over median stage")
    stalls = ev.get("one_off_stalls")
    if stalls and stalls.get("summary"):  # one or a few steps carry most of the loss: said first
        parts.insert(0, str(stalls["summary"]))
    return "; ".join(p for p in parts if p)


def _step_line(m: dict[str, Any]) -> str:
    """The run line's step time: ', step 9.80 ms (CV 0.123)'; when one or a few steps make the spread
    (``step_outliers``), the median and a robust spread lead and the mean and CV are given with and
    without them: ', step 8.44 ms median (robust CV 0.307, p95/p50 2.10); step 322 took 45.07 s: mean
    33.16 ms (CV 30.538) with it, 10.40 ms (CV 1.744) without'."""
    step = m.get("step_ms_mean")
    if not step:
        return ""
    out = m.get("step_outliers") or {}
    if not out.get("steps") or m.get("step_ms_median") is None:
        return f", step {step:.2f} ms (CV {m.get('step_cv', 0):.3f})"
    from fabricpace.diagnose.one_off import secs

    spread = []
    if m.get("step_cv_robust") is not None:
        spread.append(f"robust CV {m['step_cv_robust']:.3f}")
    if m.get("step_p95_over_p50") is not None:
        spread.append(f"p95/p50 {m['step_p95_over_p50']:.2f}")
    steps = out["steps"]
    took = ", ".join(f"{s['step']} took {secs(s['step_ms'] * 1e6)}" for s in steps)
    it = "it" if len(steps) == 1 else "them"
    line = (
        f", step {m['step_ms_median']:.2f} ms median"
        + (f" ({', '.join(spread)})" if spread else "")
        + f"; {'step' if len(steps) == 1 else 'steps'} {took}: "
        f"mean {step:.2f} ms (CV {m.get('step_cv', 0):.3f}) with {it}"
    )
    if out.get("step_ms_mean_without") is not None and out.get("step_cv_without") is not None:
        line += f", {out['step_ms_mean_without']:.2f} ms (CV {out['step_cv_without']:.3f}) without"
    return line


def _lateness(ev: dict[str, Any]) -> str:
    """'late by 4.10 ms/step', or median and mean with the component that parts them when they differ
    more than 2× (rare long pauses): the severity follows the mean, and "late by 62.31 ms/step" (the
    median) beside a 63.7% severity of 1082 ms steps read as a contradiction (an audit's GC run)."""
    med = ev["median_lateness_ms"]
    mean = ev.get("mean_lateness_ms")
    lo, hi = sorted((med, mean if mean is not None else med))
    if not (hi > 0 and (lo <= 0 or hi > 2 * lo)) or mean is None:
        return f"late by {med:.2f} ms/step"
    comp = {k: v for k, v in (ev.get("component_excess_ms") or {}).items() if v is not None and v > 0}
    top = max(comp, key=lambda k: comp[k]) if comp else None
    why = f" ({top} +{comp[top]:.2f} ms mean)" if top is not None else ""
    return f"late by {med:.2f} ms median, {mean:.2f} ms mean per step{why}"


def _culprits(c: dict[str, Any], ev: dict[str, Any] | None = None) -> str:
    from fabricpace.diagnose.stats import fmt_ranks

    def ids(noun: str, values: list[int], limit: int = 12) -> str:
        return f"{noun if len(values) == 1 else noun + 's'} {fmt_ranks(values, limit=limit)}"

    out = []
    if c["ranks"]:
        out.append(ids("rank", c["ranks"], limit=4))
    if c["nodes"]:
        # A node is the culprit when the culprits are its ranks (shared locality "node"); otherwise it
        # is only where the culprit ranks run: "rank 5 on node 1", not "rank 5; node 1".
        loc = (ev or {}).get("shared_locality") or {}
        whole = loc.get("attribute") == "node" or not c["ranks"]
        out.append(ids("node", c["nodes"], limit=4) if whole else "on " + ids("node", c["nodes"], limit=4))
    if c["stages"]:
        out.append(ids("stage", c["stages"]))
    if c["links"]:
        out.append(", ".join(c["links"][:3]))
    return "\n".join(out) or "-"


_OPEN_END = 2**62  # the last step of a window left open (``--steps 5000:``)


def _step_window(text: str, run_dirs: list[Path]) -> tuple[int, int]:
    """``--steps FIRST:LAST`` (either end may be left open) as (first, last); InputError (exit 2) when it
    is malformed or holds none of some run's steps."""
    from fabricpace.run.reader import StepChunks

    head, sep, tail = text.partition(":")
    try:
        if not sep or not (head.strip() or tail.strip()):
            raise ValueError
        first = int(head) if head.strip() else 0
        last = int(tail) if tail.strip() else _OPEN_END
    except ValueError:
        raise InputError(
            f"--steps {text!r}: expected FIRST:LAST step numbers, e.g. --steps 5000:6000"
        ) from None
    if first < 0 or last < first:
        raise InputError(f"--steps {text!r}: need 0 <= FIRST <= LAST, e.g. --steps 5000:6000")
    for run in run_dirs:
        if not run.is_dir():
            continue  # diagnose names a missing run directory itself
        span = StepChunks(run, "steps").step_span  # the footers' step statistics: no rows are read
        if span is not None and (last < span[0] or first > span[1]):
            raise InputError(
                f"--steps {text}: {run} holds steps {span[0]}..{span[1]}; choose a window inside them"
            )
    return first, last


def _window_name(window: tuple[int, int]) -> str:
    """The file-name part of a ``--steps`` window as ``_step_window`` parsed it: ``5000:6000`` ->
    ``5000-6000``, ``:6000`` -> ``0-6000``, ``5000:`` -> ``5000-end``."""
    first, last = window
    return f"{first}-{'end' if last == _OPEN_END else last}"


def _print_text(d: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape as e  # paths, warnings, reasons: shown as given, never read as markup
    from rich.table import Table

    con = Console(highlight=False)
    if not con.is_terminal:  # piped output: wide enough for the evidence column
        con = Console(highlight=False, width=140)
    for r in d["runs"]:
        m = r["metrics"]
        con.print(
            f"[bold]{e(str(r['path']))}[/bold]  {count(r['world_size'], 'rank')} / "
            f"{count(r['nodes'], 'node')}, {r['steps_used']} steps"
            + (f" ({m['step_window'][0]}..{m['step_window'][1]})" if m.get("step_window") else "")
            + _step_line(m)
            + f" — verdict: [bold]{e(str(r['verdict']))}[/bold]"
        )
        warnings = r.get("warnings", [])
        for w in warnings[:3]:
            con.print(f"  [yellow]warning:[/yellow] {e(str(w))}")
        if len(warnings) > 3:
            con.print(f"  [yellow]warning:[/yellow] … and {len(warnings) - 3} more (--format json lists all)")
        left = m.get("left_out_culprits") or {}
        if left.get("note"):
            con.print(f"  note: {e(str(left['note']))}")
        order = m.get("ring_leaf_crossings") or {}  # a ring crossing leaves more often than it must
        if order.get("note"):
            con.print(f"  note: {e(str(order['note']))}")
    if d["findings"]:
        # Severity is the what-if: the share of step time lost is what fixing the mode saves (culprits
        # at their peers' median, or the excess at its baseline). Two columns always showed one number.
        t = Table(
            title="Findings",
            show_lines=True,
            caption="Severity: share of step time lost = what fixing it would save (what-if)",
        )
        for col in ("Run", "Mode", "Severity", "Conf.", "Culprits", "Evidence"):
            t.add_column(col, overflow="fold")
        for f in d["findings"]:
            t.add_row(
                e(Path(f["run"]).name),
                e(f["mode"]),
                _severity(f),
                f"{f['confidence']:.2f}",
                e(_culprits(f["culprits"], f.get("evidence"))),
                e(_evidence_line(f)),
            )
        con.print(t)
        for f in d["findings"]:
            run = e(Path(f["run"]).name)
            con.print(f"[bold]{e(f['mode'])}[/bold] ({run}): {e(str(f['recommendation']))}")
    elif d["healthy"]:
        con.print("[green]healthy[/green]: no failure mode above its documented threshold.")
    for a in d["abstained"]:
        run = e(Path(a["run"]).name)
        if a["mode"] == "all":
            con.print(f"[yellow]no mode can be decided[/yellow] ({run}): {e(str(a['reason']))}")
        else:
            con.print(f"[yellow]cannot tell[/yellow] {e(a['mode'])} ({run}): {e(str(a['reason']))}")
    s = d.get("scaling")
    if s:
        t = Table(title="Scaling")
        for col in (
            "ranks",
            "nodes",
            "step ms",
            "throughput",
            "efficiency",
            "compute",
            "data",
            "skew wait",
            "exposed comm",
        ):
            t.add_column(col, justify="right")
        for r in s["rows"]:
            t.add_row(
                str(r["world_size"]),
                str(r["nodes"]),
                f"{r['step_ms']:.2f}",
                f"{r['throughput']:.1f} {r['throughput_unit']}",
                "-" if r["efficiency"] is None else f"{r['efficiency']:.1%}",
                f"{r['compute_ms']:.2f}",
                f"{r['data_ms']:.2f}",
                f"{r['skew_ms']:.2f}",
                f"{r['exposed_comm_ms']:.2f}",
            )
        con.print(t)
        if s.get("dominant_loss"):
            eff = s.get("efficiency_at_largest")
            con.print(
                f"Lost time as N grows goes mostly to: [bold]{e(str(s['dominant_loss']))}[/bold]"
                + (f" (efficiency at the largest size {eff:.1%})." if eff is not None else ".")
            )
        for note in s.get("notes") or []:
            con.print(f"[yellow]note:[/yellow] {e(str(note))}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""

    @app.command("diagnose")
    def diagnose_cmd(
        run_dirs: list[Path] = typer.Argument(..., metavar="RUN_DIR...", help="One or more run directories."),
        fmt: str = typer.Option("text", "--format", "-f", help="text (rich table) or json."),
        cluster: str | None = typer.Option(
            None, "--cluster", help="Cluster file or preset: judge transfers against the fabric model."
        ),
        chunk_rows: int | None = typer.Option(
            None,
            "--chunk-rows",
            help=(
                "Collective rows read at a time (default 4,000,000); lower it when the collectives hold "
                "most of the memory. The per-rank-step data is held whole whatever this is, so peak memory "
                "also grows with ranks x steps (~0.4 GB + 320 B per rank-step: ~13 GB at 4,096 x 10,000)."
            ),
        ),
        steps: str | None = typer.Option(
            None,
            "--steps",
            metavar="FIRST:LAST",
            help=(
                "Only these steps of each run (inclusive; FIRST: or :LAST leave an end open): a window of "
                "a long job, read alone, so memory and time follow the window. Written to "
                "diagnosis-steps-FIRST-LAST.json; the whole run's diagnosis.json is left as it is."
            ),
        ),
    ) -> None:
        """Name the failure mode, culprit and evidence; several sizes of one workload add scaling."""
        if fmt == "table":
            fmt = "text"
        if fmt not in ("text", "json"):
            raise InputError(f"--format {fmt!r}: choose text or json")
        if chunk_rows is not None and chunk_rows < 1:
            raise InputError(f"--chunk-rows {chunk_rows}: must be a positive number of rows")
        window = _step_window(steps, run_dirs) if steps is not None else None
        from fabricpace.cli._common import stderr_progress
        from fabricpace.diagnose import DiagnoseConfig, diagnose

        kw: dict[str, Any] = {"chunk_rows": chunk_rows} if chunk_rows is not None else {}
        config = DiagnoseConfig(**kw, steps=window) if kw or window else None
        # progress on stderr only: stdout stays pure JSON with --format json
        with stderr_progress() as progress:
            task = progress.add_task("diagnosing", total=None)
            order = {str(p): i + 1 for i, p in enumerate(run_dirs)}

            def label(path: str) -> str:
                where = f" (run {order.get(path, '?')}/{len(run_dirs)})" if len(run_dirs) > 1 else ""
                return f"diagnosing {Path(path).name}{where}: collectives chunks"

            def step(path: str) -> None:
                progress.update(task, description=label(path), completed=0, total=None)

            def chunk(path: str, done: int, total: int) -> None:
                progress.update(task, description=label(path), completed=done, total=total)

            result = diagnose(run_dirs, cluster=cluster, config=config, progress=step, chunk_progress=chunk)
        whole = result.to_dict()
        name = "diagnosis.json" if window is None else f"diagnosis-steps-{_window_name(window)}.json"
        for r in result.runs:
            _write_atomic(Path(r.path) / name, result.for_run(r.path).to_dict())
        if fmt == "json":
            sys.stdout.write(json.dumps(whole, indent=2) + "\n")
        else:
            _print_text(whole)
