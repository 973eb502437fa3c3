"""The study table's cells and notes, shared by the terminal table (``fabricpace study``) and the header of
``figures.html``, so that both print the same numbers the same way.

``table_cells(rows)`` gives one list of strings per row (columns ``table_columns(rows)``);
``table_notes(rows)`` the footnotes that apply to those cells: the "±" note only when a ± is printed,
"Δ paired by seed" only when a Δ is, "1 repeat: no CI" when no row has one, and which paced rows had no
pacing decision at all (the controller found nothing to act on, so those runs ran as the baseline).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def throughput_decimals(value: float) -> int:
    """Decimals that show at least four significant digits of a throughput (none from 1,000 up).

    Integers only used to print a 7B model's 14.6 samples/s as "15 ± 0" (and 29.1 as "29"), so the
    printed numbers disagreed with the printed efficiency and the CI vanished."""
    if not math.isfinite(value) or abs(value) >= 1000:
        return 0
    if abs(value) < 1e-3:
        return 3
    return min(3, 3 - math.floor(math.log10(abs(value))))


def fmt_throughput(row: dict[str, Any]) -> str:
    d = throughput_decimals(row["throughput"])
    ci = row.get("throughput_ci")
    if not ci:
        return f"{row['throughput']:.{d}f}"
    return f"{row['throughput']:.{d}f} ± {(ci[1] - ci[0]) / 2:.{d}f}"


def fmt_cv(row: dict[str, Any]) -> str:
    """``0.012 ± 0.021``: the half-width is the t-interval's (upper bound − mean); the interval's lower
    bound stops at 0 in ``cv_ci`` (a CV is never negative), which the figure's error bar shows."""
    ci = row.get("cv_ci")
    if not ci:
        return f"{row['cv']:.3f}"
    return f"{row['cv']:.3f} ± {ci[1] - row['cv']:.3f}"


def fmt_delta(row: dict[str, Any], *, verdict_sep: str = " ") -> str:
    d = row.get("delta_pct")
    if d is None:
        return "—"
    ci = row.get("delta_ci_pct")
    if not ci:
        return f"{d:+.2f}%"
    # A CI that contains 0 is "no change" (within noise), whatever the point estimate says.
    verdict = "" if ci[0] > 0 or ci[1] < 0 else f"{verdict_sep}(no change)"
    return f"{d:+.2f}% ± {(ci[1] - ci[0]) / 2:.2f}{verdict}"


def _has_decisions(rows: Sequence[dict[str, Any]]) -> bool:
    return any(r.get("pacing_decisions") is not None for r in rows)


def fmt_decisions(row: dict[str, Any]) -> str:
    n = row.get("pacing_decisions")
    if n is None:
        return "—"
    return "0 (none)" if n == 0 else str(n)


def table_columns(rows: Sequence[dict[str, Any]], *, decisions: bool = False) -> list[str]:
    """The columns; ``decisions``: a "pacing decisions" column when some row counted them (the
    terminal leaves it out, to stay within 80 columns: the notes say which paced rows had none)."""
    cols = ["nodes", "mode", "samples/s", "CV", "eff.", "Δ vs baseline"]
    if decisions and _has_decisions(rows):
        cols.append("pacing decisions")
    return cols


def sorted_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["nodes"], r["mode"] != "baseline"))


def table_cells(
    rows: Sequence[dict[str, Any]], *, decisions: bool = False, verdict_sep: str = " "
) -> list[list[str]]:
    """One list of cells per row, in ``sorted_rows`` order and ``table_columns`` columns
    (``verdict_sep="\\n"``: a Δ's "(no change)" on a line of its own, for narrow terminals)."""
    decisions = decisions and _has_decisions(rows)
    out = []
    for r in sorted_rows(rows):
        eff = "—" if r["efficiency"] is None else f"{r['efficiency']:.3f}"
        cells = [
            str(r["nodes"]),
            r["mode"],
            fmt_throughput(r),
            fmt_cv(r),
            eff,
            fmt_delta(r, verdict_sep=verdict_sep),
        ]
        if decisions:
            cells.append(fmt_decisions(r))
        out.append(cells)
    return out


def _nodes_list(values: Sequence[int]) -> str:
    ns = [str(n) for n in sorted(values)]
    return ns[0] if len(ns) == 1 else ", ".join(ns[:-1]) + " and " + ns[-1]


def table_notes(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The footnotes for exactly what ``table_cells`` prints."""
    notes = []
    if any(r.get("throughput_ci") or r.get("cv_ci") or r.get("delta_ci_pct") for r in rows):
        notes.append("± = half-width of the 95% CI over repeats")
    elif rows and max(int(r.get("repeats") or 1) for r in rows) < 2:
        notes.append("1 repeat: no CI (--repeats 2 or more gives one)")
    if any(r.get("delta_pct") is not None for r in rows):
        notes.append("Δ paired by seed")
    idle = [r for r in rows if r.get("pacing_decisions") == 0]
    if idle:
        nodes = sorted({r["nodes"] for r in idle})
        where = f"{_nodes_list(nodes)} {'node' if nodes == [1] else 'nodes'}"
        notes.append(f"paced at {where}: the controller made no pacing decision, so those runs ran unpaced")
    return notes
