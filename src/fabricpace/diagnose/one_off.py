"""One-off stalls: when one or a few steps carry most of a finding's loss, the finding says so.

A user audit froze one of 3 real gloo ranks with SIGSTOP for 45 s in a 1,980-step run. Step 322 took
45.07 s where the median step took 10 ms; it was 93% of the synchronization loss, and the diagnosis read
"sync_amplification 73.6% — random per-step variation amplified by synchronization", "step 33.16 ms
(CV 30.538)": a reader would hunt GC and OS noise across the fleet instead of asking what happened to
rank 1 at that moment. The loss is real (the job did wait 45 s), so the severity stays; what changes is
what the finding says about it. No failure mode of DESIGN.md describes a single stall, and a new mode
would change the diagnosis contract, so this is evidence and wording on the finding whose loss it is:

* ``dominant_steps`` — the fewest steps that carry more than ``one_off_loss_share`` (50%) of a
  finding's per-step loss, when they are at most ``one_off_max_step_share`` (1%) of the steps (at
  least one) and at most ``one_off_max_steps`` (5), and each lost at least ``one_off_min_ratio`` (10×)
  the mean of the other steps and at least ``one_off_min_step_ratio`` (5×) the median step;
* ``annotate`` — the finding's ``evidence.one_off_stalls`` (per step: the loss, the step time, the
  ranks that arrived late and where their extra time went, the wall-clock time; the share of the
  loss; the severity without those steps) and a recommendation that leads with the stall and gives
  the finding's number without it;
* ``step_outliers`` — the same rule on the run's step times (time above the median step), so the run's
  headline gives the median and a robust spread instead of a CV that one step made.

A stall that matches the observer's own window-gather timeout (``manifest.extra.observer_failures``
has ``gather`` and the stall lasted about ``gather_timeout_s``) is said to be most likely fabricpace's
own (user audit: ranks with different ``window=`` stalled 30 s at step 22, reported as the job's
sync_amplification).
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import numpy as np

from fabricpace.diagnose.config import DiagnoseConfig
from fabricpace.diagnose.findings import Finding
from fabricpace.diagnose.metrics import RunMetrics
from fabricpace.diagnose.stats import named, nanmedian, prose_list

_COMPONENTS = ("compute", "data", "gc", "paced")
_IN = {"compute": "compute", "data": "data loading", "gc": "GC", "paced": "pacing"}
# Observer parts whose failure can stall every rank for one of the observer's timeouts, and that
# timeout's name in manifest.extra.observer (only the window gather is known to: user audit 15, t2_win).
_OBSERVER_TIMEOUTS = {"gather": "gather_timeout_s"}


def dominant_steps(loss: np.ndarray, cfg: DiagnoseConfig, median_step: float) -> np.ndarray:
    """Indices (largest loss first) of the one or few steps that carry most of ``loss``; empty when the
    loss is spread over more steps than the rule allows (module docstring), or when a step among them
    lost less than ``one_off_min_step_ratio`` × ``median_step`` (the run's median step time): in a
    short run one step of 24 ms among 8 ms ones carries most of a small loss, and is no stall."""
    x = np.clip(np.nan_to_num(np.asarray(loss, dtype=float)), 0, None)
    total = float(x.sum())
    if x.size < 2 or total <= 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(-x, kind="stable")
    csum = np.cumsum(x[order])
    k = int(np.searchsorted(csum, cfg.one_off_loss_share * total, side="right")) + 1
    limit = min(cfg.one_off_max_steps, max(1, int(cfg.one_off_max_step_share * x.size)))
    if k > limit or k >= x.size:
        return np.zeros(0, dtype=np.int64)
    top = order[:k]
    rest_mean = (total - float(csum[k - 1])) / (x.size - k)
    if float(x[top].min()) < max(cfg.one_off_min_ratio * rest_mean, cfg.one_off_min_step_ratio * median_step):
        return np.zeros(0, dtype=np.int64)
    return top.astype(np.int64)


def median_step(m: RunMetrics) -> float:
    """The run's median step time, ns (0 when unknown)."""
    with np.errstate(all="ignore"):
        v = float(nanmedian(m.step_time)) if m.step_time.size else 0.0
    return v if np.isfinite(v) else 0.0


def secs(ns: float) -> str:
    """45063602765 -> '45.06 s'; 850e6 -> '850 ms'; 3.2e6 -> '3.20 ms'."""
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    return f"{ns / 1e6:.0f} ms" if ns >= 100e6 else f"{ns / 1e6:.2f} ms"


def _late_ranks(m: RunMetrics, i: int, loss_ns: float) -> list[dict[str, Any]]:
    """The ranks that arrived late in step ``i``, when their lateness explains at least half the
    step's loss: each with its lateness and the step component its extra time went to (against the
    other ranks' median of that component in that step), when that explains half of it."""
    if m.lateness is None:
        return []
    late = np.nan_to_num(m.lateness[:, i], nan=-np.inf)
    top = float(late.max()) if late.size else 0.0
    if not np.isfinite(top) or top <= 0 or top < 0.5 * loss_ns:
        return []
    rows = [int(r) for r in np.argsort(-late, kind="stable") if late[r] >= 0.5 * top][:4]
    out: list[dict[str, Any]] = []
    for r in rows:
        entry: dict[str, Any] = {"rank": int(m.ranks[r]), "lateness_ms": float(late[r]) / 1e6}
        others = np.setdiff1d(np.arange(m.n_ranks), [r])
        best, best_v = None, 0.0
        for name in _COMPONENTS:
            comp = m.components.get(name)
            if comp is None or others.size == 0:
                continue
            with np.errstate(all="ignore"):
                v = float(comp[r, i] - nanmedian(comp[others, i]))
            if np.isfinite(v) and v > best_v:
                best, best_v = name, v
        if best is not None and best_v >= 0.5 * float(late[r]):
            entry["in"] = best
            entry["component_excess_ms"] = best_v / 1e6
        out.append(entry)
    return out


def _wall_clock(m: RunMetrics, i: int) -> str | None:
    """'01:50:37 UTC': the manifest's creation time (the observer's start, to the second) plus the
    step's start on the run's timeline — for observer and lab runs, whose timeline starts then."""
    man = m.run.manifest
    if man.source not in ("observer", "lab") or "t_start_ns" not in m.run.steps.columns:
        return None
    try:
        t0 = _dt.datetime.strptime(str(man.created), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_dt.UTC)
    except ValueError:
        return None
    start = _step_start_ns(m, i)
    if start is None:
        return None
    # ``created`` is cut to the second, so the run started up to 1 s after it: half a second added.
    return (t0 + _dt.timedelta(seconds=start / 1e9 + 0.5)).strftime("%H:%M:%S UTC")


def _step_start_ns(m: RunMetrics, i: int) -> float | None:
    st = m.run.steps
    sel = st.filter(st["step"] == int(m.steps[i]))["t_start_ns"].drop_nulls()
    low = sel.min() if sel.len() else None
    return float(low) if isinstance(low, int | float) else None


def _observer_stall(m: RunMetrics, loss_ns: float) -> dict[str, Any] | None:
    """The observer part whose failure (manifest.extra.observer_failures) and timeout match a stall of
    ``loss_ns``: within 5% below to 10% + 0.5 s above the timeout."""
    extra = m.run.manifest.extra or {}
    failures = extra.get("observer_failures") or {}
    settings = extra.get("observer") or {}
    if not isinstance(failures, dict) or not isinstance(settings, dict):
        return None
    for part, key in _OBSERVER_TIMEOUTS.items():
        timeout = settings.get(key)
        if part not in failures or not isinstance(timeout, int | float) or timeout <= 0:
            continue
        s = loss_ns / 1e9
        if 0.95 * timeout <= s <= 1.1 * timeout + 0.5:
            return {
                "part": part,
                "setting": key,
                "timeout_s": float(timeout),
                "failure": str(failures[part])[:200],
            }
    return None


def describe(m: RunMetrics, idx: np.ndarray, loss: np.ndarray, threshold: float) -> dict[str, Any]:
    """``evidence.one_off_stalls`` for the steps ``idx`` (from ``dominant_steps``) of a finding whose
    per-step loss is ``loss`` and whose threshold (share of step time) is ``threshold``."""
    loss = np.clip(np.nan_to_num(np.asarray(loss, dtype=float)), 0, None)
    st = np.nan_to_num(np.asarray(m.step_time, dtype=float))
    keep = np.ones(loss.size, dtype=bool)
    keep[idx] = False
    total_time = float(st.sum())
    rest_time = float(st[keep].sum())
    steps: list[dict[str, Any]] = []
    for i in sorted(int(v) for v in idx):
        entry: dict[str, Any] = {
            "step": int(m.steps[i]),
            "loss_ms": float(loss[i]) / 1e6,
            "step_ms": float(st[i]) / 1e6,
            "late_ranks": _late_ranks(m, i, float(loss[i])),
        }
        start = _step_start_ns(m, i)
        if start is not None:
            entry["start_s"] = start / 1e9
        clock = _wall_clock(m, i)
        if clock:
            entry["wall_clock"] = clock
        obs = _observer_stall(m, float(loss[i]))
        if obs:
            entry["observer"] = obs
        steps.append(entry)
    without = float(loss[keep].sum()) / rest_time if rest_time > 0 else 0.0
    ev: dict[str, Any] = {
        "steps": steps,
        "loss_share": float(loss[idx].sum() / loss.sum()) if loss.sum() > 0 else 0.0,
        "step_share": idx.size / max(loss.size, 1),
        "severity_with_pct": 100 * float(loss.sum()) / total_time if total_time > 0 else 0.0,
        "severity_without_pct": 100 * without,
        "threshold_pct": 100 * threshold,
        "reported_without": bool(without >= threshold),
        "median_step_ms": median_step(m) / 1e6,
    }
    ev["summary"] = summary(ev)
    return ev


def _step_words(ev: dict[str, Any]) -> str:
    """'step 322' / 'steps 322 and 900'."""
    return named("step", [s["step"] for s in ev["steps"]])


def _who(s: dict[str, Any]) -> str:
    """'rank 1 arrived 3.01 s late (the extra time fell in its compute phase)', 'ranks 1 and 2 arrived
    …', or '' when no rank arrived late."""
    late = s["late_ranks"]
    if not late:
        return ""
    who = f"{named('rank', [r['rank'] for r in late])} arrived {secs(late[0]['lateness_ms'] * 1e6)} late"
    if len(late) == 1 and late[0].get("in"):
        who += f" (the extra time fell in its {_IN[late[0]['in']]} phase)"
    return who


def summary(ev: dict[str, Any]) -> str:
    """The evidence column's text: 'one stall: step 322 (rank 1 +45.06 s) = 93% of this loss; without
    it 15.8%'."""
    parts = []
    for s in ev["steps"]:
        late = s["late_ranks"]
        what = (
            f"rank {late[0]['rank']} +{secs(late[0]['lateness_ms'] * 1e6)}"
            if late
            else secs(s["loss_ms"] * 1e6)
        )
        if len(late) > 1:
            what = f"ranks {prose_list([r['rank'] for r in late])} +{secs(late[0]['lateness_ms'] * 1e6)}"
        if s.get("observer"):
            what += f"; observer's {s['observer']['part']} timeout"
        parts.append(f"{s['step']} ({what})")
    n = len(ev["steps"])
    head = "one stall: step " if n == 1 else f"{n} stalls: steps "
    return (
        f"{head}{', '.join(parts)} = {ev['loss_share']:.0%} of this loss; without "
        f"{'it' if n == 1 else 'them'} {ev['severity_without_pct']:.1f}%"
    )


def _sentence(ev: dict[str, Any], mode: str) -> str:
    """What the recommendation leads with: the stall(s) named, what to check, the number without."""
    n = len(ev["steps"])
    median = secs(ev["median_step_ms"] * 1e6)
    bits = []
    for s in ev["steps"]:
        when = f"step {s['step']}"
        if s.get("wall_clock"):
            when += f" (about {s['wall_clock']}, {s['start_s']:.1f} s after the run started)"
        took = f"took {secs(s['step_ms'] * 1e6)} where the median step takes {median}"
        if s["late_ranks"]:
            bits.append(f"{when} {took}: {_who(s)}")
        else:
            bits.append(f"{when} {took}, and no rank arrived late: the time went into the step's collectives")
    lead = (
        f"Most of this loss ({ev['loss_share']:.0%}) is {'one stall' if n == 1 else f'{n} stalls'}: "
        f"{'; '.join(bits)}. "
    )
    observer = [s for s in ev["steps"] if s.get("observer")]
    if observer and len(observer) == n:
        o = observer[0]["observer"]
        lead += (
            f"{'It matches' if n == 1 else 'They match'} fabricpace's own window {o['part']} timing out "
            f"({o['setting']} {o['timeout_s']:g} s; manifest.json extra.observer_failures.{o['part']}): "
            f"most likely the observer's stall, not the job's — check that every rank called observe() "
            f"with the same settings (window=, gather_lag_steps=), and report it if they did. "
        )
    else:
        ranks = sorted({r["rank"] for s in ev["steps"] for r in s["late_ranks"]})
        where = f"on {named('rank', ranks)}'s host" if ranks else "on the hosts"
        lead += (
            f"A one-off like that is not per-step noise: check what happened {where} at that time — a "
            "checkpoint or other blocking I/O, preemption or a stopped process (SIGSTOP, a debugger), "
            "swapping, a node event in the system logs. "
        )
    steps = _step_words(ev)
    without = ev["severity_without_pct"]
    if ev["reported_without"]:
        lead += f"Without {steps}, {mode} is {without:.1f}% of step time: "
    else:
        lead += (
            f"Without {steps}, {mode} is {without:.1f}% of step time, below the {ev['threshold_pct']:g}% "
            f"from which it is reported: apart from {'that stall' if n == 1 else 'those stalls'} there is "
            "nothing of this kind to fix."
        )
    return lead


def annotate(
    f: Finding,
    m: RunMetrics,
    loss: np.ndarray,
    threshold: float,
    cfg: DiagnoseConfig,
    idx: np.ndarray | None = None,
) -> np.ndarray:
    """Add ``evidence.one_off_stalls`` and lead the recommendation with the stall when one or a few
    steps carry most of ``loss`` (the finding's per-step loss, ns); returns those steps' indices
    (empty: nothing changed). ``idx``: the steps, when the detector already found them."""
    if idx is None:
        idx = dominant_steps(loss, cfg, median_step(m))
    if idx.size == 0:
        return idx
    ev = describe(m, idx, loss, threshold)
    f.evidence["one_off_stalls"] = ev
    lead = _sentence(ev, f.mode)  # in the recommendation only (the evidence has the numbers)
    f.recommendation = lead + f.recommendation if ev["reported_without"] else lead
    return idx


def step_outliers(m: RunMetrics, cfg: DiagnoseConfig) -> dict[str, Any] | None:
    """The run's headline when one or a few steps make its step-time spread: the same rule as
    ``dominant_steps`` on each step's time above the median step; the steps, and the mean and CV with
    and without them. None when no step stands out so."""
    t = np.asarray(m.step_time, dtype=float)
    ok = np.isfinite(t)
    if ok.sum() < 2:
        return None
    med = float(np.median(t[ok]))
    idx = dominant_steps(np.where(ok, t - med, 0.0), cfg, med)
    if idx.size == 0:
        return None
    keep = ok.copy()
    keep[idx] = False
    rest = t[keep]
    return {
        "steps": [
            {"step": int(m.steps[i]), "step_ms": float(t[i]) / 1e6} for i in sorted(int(v) for v in idx)
        ],
        "step_ms_mean_without": float(rest.mean()) / 1e6 if rest.size else None,
        "step_cv_without": float(rest.std() / rest.mean()) if rest.size and rest.mean() > 0 else None,
    }
