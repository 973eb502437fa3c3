"""The HTML report: one self-contained file that works offline (plotly's JavaScript inlined once).

Order: findings first (what is wrong, who, how much it costs, what to do), then the run table, then
the pictures a person would rather look at than read — step-time heatmap (rank × step), arrival-skew
distribution, last-arriver share, per-rank breakdown, the scaling curve when several runs are given,
and a timeline of chosen steps (the paper's Figure 2).
"""

from __future__ import annotations

import html
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
import polars as pl

from fabricpace._errors import InputError
from fabricpace.diagnose.stats import named
from fabricpace.report import data as rd
from fabricpace.report import figures
from fabricpace.report import injected as inj_mod
from fabricpace.report.evidence import CONFIDENCE_HELP
from fabricpace.report.evidence import described as evidence_described
from fabricpace.report.output import check_new_file, publish
from fabricpace.report.timeline import MAX_TIMELINE_RANKS, pick_ranks, timeline_figure
from fabricpace.run.reader import RunData, StepChunks, load_run
from fabricpace.run.schema import COLLECTIVE_COLUMNS

Progress = Callable[[str, int, int], None]  # (what, done, total)

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1280px;
color:#222;padding:0 16px}
h1{font-size:26px;margin-bottom:4px} h2{font-size:20px;margin-top:34px;border-bottom:1px solid #ddd;
padding-bottom:4px} h3{font-size:16px;margin-top:22px}
.meta{color:#666;font-size:13px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top} th{background:#f4f4f4}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.finding{border-left:5px solid #E45756;background:#fff7f6;padding:8px 14px;margin:10px 0}
.finding.low{border-color:#F58518;background:#fffaf2}
.healthy{border-left:5px solid #54A24B;background:#f4fbf3;padding:8px 14px;margin:10px 0}
.truth{border-left:5px solid #4C78A8;background:#f3f7fb;padding:8px 14px;margin:10px 0}
.note{border-left:5px solid #999;background:#f7f7f7;padding:8px 14px;margin:10px 0}
.finding h3{margin:4px 0} code{background:#f1f1f1;padding:0 3px}
ul.evidence{margin:2px 0 4px;padding-left:20px;columns:2 360px;font-size:13px}
ul.evidence li{break-inside:avoid}
.defs{margin:2px 0 10px} details.glossary{font-size:13px;margin:6px 0} dl{margin:4px 0}
dt{font-weight:bold;margin-top:4px} dd{margin-left:16px} nav.toc{font-size:13px;margin:6px 0}
nav.toc a{margin-right:12px}
"""


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


# Column heads of the run table and what each means (a tooltip on the head and a line under the table).
RUN_COLUMNS: tuple[tuple[str, str | None], ...] = (
    ("run", None),
    ("source", None),
    ("ranks", None),
    ("nodes", None),
    ("steps used", "steps after the warm-up the diagnosis leaves out (by default its first min(20, steps/10) "
                   "steps, at least 1); every column uses these steps"),
    ("median step (ms)", "step time = median over ranks of each rank's step duration; median over steps"),
    ("p95 step (ms)", None),
    ("step CV", "standard deviation over mean of the step time"),
    ("collective instances", "collectives seen by two or more ranks"),
    ("arrival spread p50 (ms)",
     "per collective instance, last arrival − first arrival; median over instances"),
    ("lost to late peers / step",
     "per rank and step, the time the rank was blocked in its collectives before its last peer arrived (the "
     "rest of its blocked time is exposed transfer); mean over ranks and steps, over the mean step time"),
    ("most frequent last arriver", "the rank (and node, when one node stands out) that arrived last in the "
                                   "most instances with a spread > 0, with its share of them"),
)


def summary_table(summaries: Sequence[rd.RunSummary]) -> str:
    """The run table as HTML, with a line defining its columns (deterministic: the golden test
    compares it byte for byte)."""
    rows = []
    for s in summaries:
        last = "–" if s.top_last_arriver is None else f"rank {s.top_last_arriver} ({s.top_last_share:.0%})"
        if s.top_last_node is not None and s.top_last_node_share is not None:
            last = f"node {s.top_last_node} ({s.top_last_node_share:.0%}); " + last
        used = f"{s.steps} (after {s.warmup} warm-up)" if s.warmup else str(s.steps)
        cells = [
            f"<td>{_esc(s.name)}</td>", f"<td>{_esc(s.source)}</td>",
            f'<td class="num">{s.world_size}</td>', f'<td class="num">{s.nodes}</td>',
            f'<td class="num">{_esc(used)}</td>', f'<td class="num">{_fmt(s.median_step_ms)}</td>',
            f'<td class="num">{_fmt(s.p95_step_ms)}</td>', f'<td class="num">{_fmt(s.cv, 3)}</td>',
            f'<td class="num">{s.instances}</td>', f'<td class="num">{_fmt(s.median_skew_ms, 3)}</td>',
            f'<td class="num">{"–" if s.skew_share is None else f"{s.skew_share:.1%}"}</td>',
            f"<td>{_esc(last)}</td>",
        ]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    header = "<tr>" + "".join(
        f'<th title="{_esc(d)}">{_esc(h)}</th>' if d else f"<th>{_esc(h)}</th>" for h, d in RUN_COLUMNS
    ) + "</tr>"
    defs = "; ".join(f"<b>{_esc(h)}</b>: {_esc(d)}" for h, d in RUN_COLUMNS if d)
    return (
        '<table class="runs">\n' + header + "\n" + "\n".join(rows) + "\n</table>\n"
        f'<div class="meta defs">{defs}.</div>'
    )


def _culprits(c: dict[str, Any]) -> str:
    """{'ranks': [3], 'nodes': [0, 1]} -> 'rank 3; nodes 0 and 1' (links listed as they are)."""
    parts = [
        ", ".join(map(str, vals)) if k == "links" else named(k.rstrip("s"), list(vals), limit=12)
        for k, vals in c.items()
        if vals
    ]
    return "; ".join(parts) if parts else "–"


def findings_html(diag: dict[str, Any] | None, note: str | None) -> str:
    """The findings section from ``Diagnosis.to_dict()`` (or a note saying why there is none)."""
    out = ['<h2 id="findings">Findings</h2>']
    if diag is None:
        out.append(f'<div class="note">No diagnosis in this report: {_esc(note or "not requested")}.</div>')
        return "\n".join(out)
    found = diag.get("findings") or []
    runs = [r for r in diag.get("runs") or [] if isinstance(r, dict)]
    verdicts = [f"{Path(str(r.get('path', '?'))).name}: {r.get('verdict', '?')}" for r in runs]
    if verdicts:
        out.append(f'<div class="meta">Verdict per run — {_esc("; ".join(verdicts))}</div>')
    if not found and diag.get("healthy"):
        out.append('<div class="healthy"><b>Healthy</b>: no failure mode above its documented threshold.'
                   "</div>")
    elif not found:
        out.append('<div class="note"><b>Undecided</b>: no failure mode was confirmed, and the data does not '
                   "allow calling the run healthy either (reasons below).</div>")
    terms: dict[str, str] = {}
    for f in sorted(found, key=lambda f: -(f.get("severity_pct") or 0.0)):
        sev = f.get("severity_pct")
        cls = "finding" if (sev or 0) >= 5 else "finding low"
        shown = evidence_described(f.get("evidence") or {})
        evidence = "".join(
            (f'<li title="{_esc(d)}">' if d else "<li>") + f"{_esc(k)}: {_esc(v)}</li>" for k, v, d in shown
        )
        terms.update((k, d) for k, _v, d in shown if d)
        ci = f.get("severity_ci_pct")
        ci_text = ""
        if isinstance(ci, list | tuple) and len(ci) == 2:
            ci_text = f" [CI {_fmt(ci[0], 1)}–{_fmt(ci[1], 1)}]"
        where = f" in {Path(str(f['run'])).name}" if f.get("run") else ""
        out.append(
            f'<div class="{cls}"><h3>{_esc(f.get("mode", "?"))}{_esc(where)} — {_fmt(sev, 1)}%{ci_text} of '
            f'step time lost (<span title="{_esc(CONFIDENCE_HELP)}">confidence '
            f'{_esc(_fmt(f.get("confidence")))}</span>)</h3>'
            f"<div><b>Culprits:</b> {_esc(_culprits(f.get('culprits') or {}))}</div>"
            + (f'<div><b>Evidence:</b><ul class="evidence">{evidence}</ul></div>' if evidence else
               "<div><b>Evidence:</b> –</div>")
            + f"<div><b>What-if:</b> fixing it would save about {_fmt(f.get('what_if_saving_pct'), 1)}%"
            " of step time</div>"
            f"<div><b>Recommendation:</b> {_esc(f.get('recommendation', '–'))}</div></div>"
        )
    # Per-run notes a user must not miss even when the verdict is "healthy": culprits left out of the
    # loss, and a ring that crosses leaves more often than it must (both printed by diagnose's text too).
    run_notes = [
        f"{Path(str(r.get('path', '?'))).name}: {n['note']}"
        for r in runs
        for key in ("left_out_culprits", "ring_leaf_crossings")
        if isinstance(n := (r.get("metrics") or {}).get(key), dict) and n.get("note")
    ]
    if run_notes:
        items = "".join(f"<li>{_esc(t)}</li>" for t in run_notes)
        out.append(f'<div class="note"><b>Notes</b>:<ul>{items}</ul></div>')
    abstained = diag.get("abstained") or []
    if abstained:
        texts = [
            a if isinstance(a, str) else f"{a.get('mode', '?')} ({Path(str(a.get('run', '?'))).name}): "
            f"{a.get('reason', '?')}"
            for a in abstained
        ]
        items = "".join(f"<li>{_esc(t)}</li>" for t in texts)
        out.append(f'<div class="note"><b>Could not decide</b> (abstained):<ul>{items}</ul></div>')
    if found:
        terms["confidence"] = CONFIDENCE_HELP
        listed = "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(d)}</dd>" for k, d in terms.items())
        out.append('<details class="glossary"><summary>What the evidence terms mean</summary>'
                   f"<dl>{listed}</dl></details>")
    return "\n".join(out)


_KIND_WORDS = {"lab": "a fabric-lab run", "local": "a local run (gloo ranks on loopback)",
               "sim": "a simulation"}


def injected_html(runs: Sequence[tuple[str, Path, inj_mod.Injected]], diag: dict[str, Any] | None) -> str:
    """The "What this run injected" section: per lab, local or simulated run, the faults put into it
    on purpose (``report.injected``), and how the findings compare; '' when no run recorded any (a
    real job's run directory)."""
    if not runs:
        return ""
    findings = [f for f in (diag or {}).get("findings") or [] if isinstance(f, dict)]
    title = "What this run injected" if len(runs) == 1 else "What these runs injected"
    out = [f'<h2 id="injected">{title}</h2>']
    for name, path, inj in runs:
        what = "the scenario" if inj.kind != "sim" else "the noise file"
        label = "scenario" if inj.kind != "sim" else "noise"
        head = f"<h3>Run {_esc(name)}</h3>" if len(runs) > 1 else ""
        parts = [
            f'<div class="truth">{head}<b>Ground truth</b> of {_KIND_WORDS[inj.kind]}, {label} '
            f"<code>{_esc(inj.name)}</code>: what {what} put into this run on purpose (manifest.json "
            + ("extra.faults and lab/lab.json" if inj.kind != "sim" else "extra.noise")
            + "), to hold the findings against. A run observed in a real job has no such section: its "
            "causes are unknown until diagnosed."
        ]
        if inj.faults:
            how = any(f.applied for f in inj.faults)  # a simulation's faults are applied as written
            rows = "".join(
                f"<tr><td>{_esc(f.where)}</td><td>{_esc(f.what)}</td>"
                + (f"<td>{_esc(f.applied or '–')}</td>" if how else "") + "</tr>"
                for f in inj.faults
            )
            parts.append('<table class="injected"><tr><th>where</th><th>injected</th>'
                         + ("<th>how it was applied</th>" if how else "") + f"</tr>{rows}</table>")
        else:
            parts.append(f"<div>Nothing injected: {what} has no faults (a healthy baseline).</div>")
        for n in inj.notes:
            parts.append(f'<div class="meta">{_esc(n)}</div>')
        if inj.expect:
            parts.append(f"<div><b>The scenario is meant to show:</b> {_esc(inj.expect)}</div>")
        if diag is not None:
            line = inj_mod.compare_line(inj, findings, run_dir=path)
            if line:
                parts.append(f"<div><b>Findings against the injection:</b> {_esc(line)}.</div>")
            for note in inj_mod.cause_notes(inj, findings, run_dir=path):
                parts.append(f"<div>{_esc(note)}.</div>")
        parts.append("</div>")
        out.append("".join(parts))
    return "\n".join(out)


def _injections(names: Sequence[str], runs: Sequence[RunData]) -> list[tuple[str, Path, inj_mod.Injected]]:
    out = []
    for name, run in zip(names, runs, strict=True):
        got = inj_mod.from_manifest(run.manifest.source, run.manifest.extra, run.path)
        if got is not None:
            out.append((name, run.path, got))
    return out


def _diagnose(
    run_dirs: Sequence[Path], cluster: Path | None, progress: Progress | None = None
) -> tuple[dict[str, Any] | None, str | None]:
    try:
        from fabricpace.diagnose import diagnose  # type: ignore[attr-defined]
    except ImportError as exc:
        return None, f"the diagnosis module is not available ({exc})"

    def tick(run: str, done: int, total: int) -> None:
        if progress:
            progress(f"diagnosing {Path(run).name}", done, total)

    try:
        return diagnose([str(p) for p in run_dirs], cluster=cluster, chunk_progress=tick).to_dict(), None
    except InputError:
        raise
    except Exception as exc:  # the pictures are still worth having; say why the findings are missing
        print(f"fabricpace: warning: diagnosis failed: {exc}", file=sys.stderr)
        return None, f"the diagnosis failed ({type(exc).__name__}: {exc})"


def default_steps(run: RunData, width: int = 1, warmup: int | None = None) -> tuple[int, int] | None:
    """The slowest synchronized step after warm-up and its neighbours: where the timeline is most
    instructive (the first steps are slow for reasons of their own: compilation, allocator, NCCL setup).
    ``warmup``: steps left out at the start (default: the diagnosis's, ``rd.warmup_steps``)."""
    sync = rd.synchronized_step_ns(run)
    if sync.height == 0:
        return None
    first, _warm = rd.after_warmup(run, warmup)
    if first is not None:
        sync = sync.filter(pl.col("step") >= first)
    steps = sync["step"].to_numpy()
    i = int(sync["step_ns"].arg_max() or 0)
    return int(steps[max(0, i - width)]), int(steps[min(len(steps) - 1, i + width)])


def check_steps(run: RunData, name: str, window: tuple[int, int]) -> None:
    """InputError when the run has none of the steps ``window`` asks for (--steps)."""
    lo, hi = window
    have = run.steps["step"].drop_nulls().to_numpy() if run.steps.height else np.zeros(0, dtype=np.int64)
    if ((have >= lo) & (have <= hi)).any():
        return
    where = f"it has steps {int(have.min())}–{int(have.max())}" if have.size else "it has no steps"
    raise InputError(f"--steps {lo}:{hi}: run {name} has none of these steps ({where}); choose steps in it")


def _fig_html(fig: go.Figure, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


def pacing_html(pacing: pl.DataFrame) -> str:
    """The pacing controller's decisions (pacing.parquet): step, rank, policy, action, reason; '' when
    pacing decided nothing. A run paced with ``auto`` can look healthy in the arrivals because the
    controller moved samples away from a slow rank: the reader must see that it did."""
    if pacing.height == 0:
        return ""
    cols = [c for c in ("step", "rank", "policy", "action", "reason") if c in pacing.columns]
    rows = []
    for r in pacing.sort("step", maintain_order=True).iter_rows(named=True):
        cells = []
        for c in cols:
            v = r[c]
            text = "all" if c == "rank" and v == -1 else _fmt(v)
            cls = ' class="num"' if c in ("step", "rank") else ""
            cells.append(f"<td{cls}>{_esc(text)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    head = "<tr>" + "".join(f"<th>{_esc(c)}</th>" for c in cols) + "</tr>"
    return (
        f"<h3>Pacing decisions ({pacing.height})</h3>"
        '<div class="meta">From pacing.parquet: what the pacing controller changed during the run. '
        "Samples moved away from a rank hide it from arrival times, not from its compute per sample."
        '</div><table class="pacing">' + head + "".join(rows) + "</table>"
    )


def _run_sections(
    name: str, run: RunData, stats: rd.CollectiveStats, idx: int, steps: tuple[int, int] | None,
    warmup: int | None = None,
) -> list[str]:
    first, warm = rd.after_warmup(run, warmup)
    inst = stats.instances if first is None else stats.instances.filter(pl.col("step") >= first)
    ranks = rd.rank_ids(run)
    out = [f'<h2 id="run-{idx}">Run {_esc(name)}</h2>']
    for w in run.warnings:
        out.append(f'<div class="note">{_esc(w)}</div>')
    paced = pacing_html(run.pacing)
    if paced:
        out.append(paced)
    if run.steps.height == 0:
        out.append('<div class="note">This run has no step rows: nothing to draw.</div>')
        return out
    out.append(_fig_html(figures.heatmap(run, stats.waits), f"heatmap-{idx}"))
    if inst.height and int((inst["skew_ns"] > 0).sum()):
        out.append(_fig_html(figures.skew_distribution(inst, warm), f"skew-{idx}"))
        out.append(_fig_html(figures.last_arrivers(rd.last_arriver_share(inst, ranks), warm), f"last-{idx}"))
    elif inst.height:
        after = f" {figures.warmup_words(warm)}" if warm else ""
        out.append(f'<div class="note">All ranks arrived at the same time at every one of the '
                   f"{inst.height:,} collective instances{_esc(after)} (arrival spread 0): there is no "
                   "arrival-spread distribution and no last arriver to draw.</div>")
    else:
        out.append('<div class="note">No collectives seen by two or more ranks: arrival spread and last '
                   "arrivers cannot be drawn.</div>")
    parts = rd.breakdown(run, stats.waits, from_step=first)
    out.append(_fig_html(figures.breakdown_bars(parts, warm), f"breakdown-{idx}"))
    window = steps or default_steps(run, warmup=warm)
    if window is not None:
        # The timelines draw a few steps: only those steps' collectives are read.
        run = replace(run, collectives=StepChunks(run.path).read(*window))
        shown = pick_ranks(run, MAX_TIMELINE_RANKS)  # the same ranks in both timelines
        phases = timeline_figure(run, window, ranks=shown)  # the paper's Figure 2, shared with the study
        out.append(_fig_html(phases, f"phases-{idx}"))
        out.append(_fig_html(figures.timeline(run, window, ranks=shown), f"timeline-{idx}"))
    return out


def _stats(run: RunData, name: str, progress: Progress | None) -> rd.CollectiveStats:
    table = StepChunks(run.path, columns=COLLECTIVE_COLUMNS, categorical=True, coverage=run.coverage)

    def tick(done: int, total: int) -> None:
        if progress:
            progress(f"reading {name}", done, total)

    stats = rd.collective_stats(table, steps=run.steps, progress=tick)
    run.warnings.extend(table.warnings)
    return stats


def _names(run_dirs: Sequence[Path]) -> list[str]:
    names = [p.resolve().name or str(p) for p in run_dirs]
    if len(set(names)) < len(names):
        names = [str(p) for p in run_dirs]
    return names


def _warmups(diag: dict[str, Any] | None, paths: Sequence[Path]) -> list[int | None]:
    """Each run's warm-up as the diagnosis used it (None: not in the diagnosis, use the default)."""
    used: dict[str, int] = {}
    for r in (diag or {}).get("runs") or []:
        if isinstance(r, dict):
            w = (r.get("metrics") or {}).get("warmup_steps")
            if isinstance(w, int) and not isinstance(w, bool):
                used[str(r.get("path"))] = w
    return [used.get(str(p)) for p in paths]


def render_report(
    run_dirs: Sequence[str | os.PathLike[str]],
    *,
    steps: tuple[int, int] | None = None,
    findings: bool = True,
    cluster: Path | None = None,
    progress: Progress | None = None,
) -> str:
    """The whole report as one HTML string. ``progress(label, done, total)`` while the collectives
    are read (chunk by chunk: the collectives' share of memory is bounded by the chunk size; the steps
    table and the rank x step matrices still grow with ranks x steps, ~590 B per rank-step)."""
    from plotly.offline import get_plotlyjs

    if not run_dirs:
        raise InputError("report: pass at least one run directory")
    paths = [Path(p) for p in run_dirs]
    # The collectives table is the big one: never loaded whole, streamed into small summaries.
    runs = [load_run(p, tables=("ranks", "steps", "pacing")) for p in paths]
    names = _names(paths)
    if steps is not None:  # before the work: a window no run has would draw empty timelines
        for name, run in zip(names, runs, strict=True):
            check_steps(run, name, steps)
    diag, note = _diagnose(paths, cluster, progress) if findings else (None, "made with --no-findings")
    warmups = _warmups(diag, paths)
    stats = [_stats(run, name, progress) for name, run in zip(names, runs, strict=True)]
    # The warnings are in the HTML too, but a damaged run must not pass silently on the terminal.
    for w in dict.fromkeys(w for run in runs for w in run.warnings):
        print(f"fabricpace: warning: {w}", file=sys.stderr)
    summaries = [
        rd.summarize(r, n, st, warmup=w) for n, r, st, w in zip(names, runs, stats, warmups, strict=True)
    ]
    injections = _injections(names, runs)
    toc = [("findings", "Findings")]
    if injections:
        toc.append(("injected", "What was injected"))
    toc.append(("runs", "Runs"))
    if len(runs) > 1:
        toc.append(("scaling", "Scaling"))
    toc += [(f"run-{i}", f"Run {n}") for i, n in enumerate(names)]
    body = [
        "<h1>fabricpace report</h1>",
        f'<div class="meta">generated {time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())} · '
        f"{len(runs)} {'run' if len(runs) == 1 else 'runs'}: {_esc(', '.join(names))}</div>",
        '<nav class="toc">' + "".join(f'<a href="#{a}">{_esc(t)}</a>' for a, t in toc) + "</nav>",
        findings_html(diag, note),
        injected_html(injections, diag),
        '<h2 id="runs">Runs</h2>',
        summary_table(summaries),
    ]
    if len(runs) > 1:
        body.extend(_scaling_section(names, runs, paths, [st.waits for st in stats], warmups))
    for i, (name, run, st) in enumerate(zip(names, runs, stats, strict=True)):
        body.extend(_run_sections(name, run, st, i, steps, warmups[i]))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>fabricpace report</title>"
        f"<style>{_CSS}</style><script type=\"text/javascript\">{get_plotlyjs()}</script></head>"
        "<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def _scaling_section(names: list[str], runs: list[RunData], paths: list[Path], waits: list[pl.DataFrame],
                     warmups: list[int | None]) -> list[str]:
    """The Scaling section: step time across the training runs; nccl-tests size sweeps, whose "steps"
    are message sizes (a mean step over sizes, "efficiency 78%", meant nothing: audit 17), get their
    time and bandwidth per size and rank count instead, as ``diagnose`` treats them (metrics.size_sweep)."""
    out = ['<h2 id="scaling">Scaling</h2>']
    sweeps = [i for i, run in enumerate(runs) if rd.is_size_sweep(run)]
    train = [i for i in range(len(runs)) if i not in sweeps]
    if len(train) > 1:
        rows = rd.scaling_rows([(names[i], runs[i]) for i in train], [waits[i] for i in train],
                               [warmups[i] for i in train])
        out.append(_fig_html(figures.scaling(rows), "scaling-fig"))
        out.append(_scaling_table(rows))
    if not sweeps:
        return out
    which = ", ".join(names[i] for i in sweeps)
    alone = " (and one training run has nothing to compare with)" if len(train) == 1 else ""
    out.append(
        f'<p class="meta">{_esc(which)}: nccl-tests size {"sweeps" if len(sweeps) > 1 else "sweep"}: one '
        "step per message size, not a training run, so step-time statistics (mean step, where it goes, "
        f"efficiency) are left out (they would describe the sizes){_esc(alone)}; below, time and "
        "bandwidth at each size and rank count, as <code>fabricpace diagnose</code> lists them "
        "(metrics.size_sweep).</p>"
    )
    rows = pl.concat([rd.size_sweep_rows(load_run(paths[i], tables=("steps", "collectives")), names[i])
                      for i in sweeps])
    if rows.height:
        out.append(_fig_html(figures.size_sweep(rows), "sweep-fig"))
        out.append(_sweep_table(rows))
    return out


def _size(n: int) -> str:
    """1073741824 -> '1 GiB', 8 -> '8 B' (as diagnose's sweep note writes sizes)."""
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def _sweep_table(rows: pl.DataFrame) -> str:
    """One row per (op, size); per sweep run (ordered by rank count) its time, algbw and busbw there."""
    runs = rows.select("run", "world_size", "nodes").unique(maintain_order=True).sort("world_size")
    keys = rows.select("op", "bytes").unique().sort("op", "bytes")
    metrics = (("time_ms", "time (ms)", 3), ("algbw_gbytes_s", "algbw (GB/s)", 2),
               ("busbw_gbytes_s", "busbw (GB/s)", 2))
    head = ('<tr><th rowspan="2">op</th><th rowspan="2">size</th>' + "".join(
        f'<th colspan="3">{_esc(r)} ({n} ranks, {k} node{"s" if k != 1 else ""})</th>'
        for r, n, k in runs.iter_rows()) + "</tr><tr>" + "".join(
        f"<th>{_esc(label)}</th>" for _ in range(runs.height) for _c, label, _d in metrics) + "</tr>")
    at = {(r["run"], r["op"], r["bytes"]): r for r in rows.iter_rows(named=True)}
    body = []
    for op, size in keys.iter_rows():
        cells = [f"<td>{_esc(op)}</td>", f'<td class="num">{_esc(_size(size))}</td>']
        for run in runs["run"]:
            row = at.get((run, op, size))
            cells += [f'<td class="num">{_esc(_fmt(row[c] if row else None, d))}</td>'
                      for c, _l, d in metrics]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        '<table class="sweep">' + head + "".join(body) + "</table>"
        '<div class="meta defs">Per message size: <b>time</b> = median over ranks of that size\'s step (the '
        "log's out-of-place time); <b>algbw</b> = size ÷ time; <b>busbw</b> = nccl-tests' bus bandwidth "
        "(algbw scaled by the collective's traffic factor, comparable across rank counts).</div>"
    )


SCALING_COLUMNS = {
    "run": "run", "world_size": "ranks", "nodes": "nodes", "step_ms": "mean step (ms)",
    "compute_ms": "compute (ms)", "skew_wait_ms": "lost to late peers (ms)",
    "transfer_ms": "exposed transfer (ms)", "efficiency": "efficiency",
}


def _scaling_table(rows: pl.DataFrame) -> str:
    cols = [c for c in SCALING_COLUMNS if c in rows.columns]
    head = "<tr>" + "".join(f"<th>{_esc(SCALING_COLUMNS[c])}</th>" for c in cols) + "</tr>"
    body = []
    for r in rows.iter_rows(named=True):
        cells = []
        for c in cols:
            v = r[c]
            text = f"{v:.0%}" if c == "efficiency" and v is not None else _fmt(v)
            cells.append(f'<td class="num">{_esc(text)}</td>' if c != "run" else f"<td>{_esc(v)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        '<table class="scaling">' + head + "".join(body) + "</table>"
        '<div class="meta defs">Per run, after its warm-up: <b>mean step</b> = mean over steps of the step '
        "time (median over ranks); <b>compute</b>, <b>lost to late peers</b> and <b>exposed transfer</b> = "
        "means over ranks and steps of own compute, of the time blocked before the last peer arrived, and "
        "of the rest of the blocked time (as in the Runs table); <b>efficiency</b> = the smallest run's mean "
        "step ÷ this run's (weak scaling: a fixed batch per rank). <code>fabricpace diagnose</code> on the "
        "same runs splits the step the same way (its skew: slowest − median rank's own work).</div>"
    )


def write_report(
    run_dirs: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    steps: tuple[int, int] | None = None,
    findings: bool = True,
    cluster: Path | None = None,
    progress: Progress | None = None,
) -> Path:
    """Render and write the report to the new file ``out`` atomically (never over an existing file)."""
    path = check_new_file(out, "report.html")
    text = render_report(run_dirs, steps=steps, findings=findings, cluster=cluster, progress=progress)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        publish(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
