"""A finding's evidence, written for a person: labels in words, values with units and sensible rounding.

The diagnosis keeps its evidence as a JSON mapping (``Finding.evidence``: exact numbers for scripts).
A report reader wants ``median lateness 21.51 ms`` and ``last arriver share 99.4%``, not
``median_lateness_ms = 21.506565``. The unit comes from the key's name, which the detectors use
consistently: ``*_ms`` milliseconds, ``*share*``/``precision`` fractions shown as percent, ``*_pct``
percent, ``*inflation*`` a factor, ``*_z`` a z-score. Nested mappings take their parent's unit
(``component_excess_ms = {compute: 21.5, ...}`` is ms per component) and become short lists; values
that are missing (``None``/NaN) or round to zero in an "excess" breakdown are left out, and long lists
are cut to a few items with a count of the rest.

``GLOSSARY`` gives the terms a definition (the report shows it as a tooltip and in a list under the
findings) and, where the words made from the key would collide with another number of the report, a
name of their own: four different numbers read "skew" in one report (audit 15).
"""

from __future__ import annotations

import math
from typing import Any

from fabricpace.diagnose.locality import slot_names

_MAX_ITEMS = 4
_WORDS = {"cv": "CV", "z": "z-score", "iid": "iid"}
_ID_NOUNS = ("stage", "rank", "node", "leaf")  # stage_work = {2: 104.0, ...} reads "stage 2 104.02 ms"


def _unit(key: str) -> str:
    k = key.lower()
    if k.endswith("_ms") or "_ms_" in k:
        return "ms"
    if "excess_over" in k:  # a relative excess: +30% over the median stage
        return "share"
    if k.endswith("_pct"):
        return "pct"
    if "share" in k or k in ("precision", "confidence") or k.endswith("_made_of"):
        return "share"
    if "inflation" in k or "max_over" in k:
        return "factor"
    if k.endswith("_z"):
        return "z"
    return ""


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and not math.isfinite(v))


def _number(v: float | int, unit: str, signed: bool = False) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    sign = "+" if signed else ""
    if unit == "ms":
        return f"{v:{sign}.2f} ms"
    if unit == "pct":
        return f"{v:{sign}.1f}%"
    if unit == "share":
        return f"{v:{sign}.1%}"
    if unit == "factor":
        return f"×{v:.2f}"
    if unit == "z":
        return f"{v:+.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:.3g}"


_SLOWEST = (
    "per step, how long the median rank arrived before that step's slowest rank "
    "(persistent culprits left out)"
)
# key -> (label, or None for the words of the key; one-line definition)
GLOSSARY: dict[str, tuple[str | None, str]] = {
    # sync_amplification
    "skew_share_of_step": (
        "wait for each step's slowest rank, share of step",
        f"{_SLOWEST}, summed over steps, over the total step time (this finding's severity)",
    ),
    "mean_skew_ms": ("wait for each step's slowest rank, mean", f"{_SLOWEST}, mean over steps"),
    "iid_model_skew_ms": (
        "that wait expected from independent noise",
        "c_N·σ: the expected maximum of N independent normal latenesses above their median, with σ the "
        "spread of rank lateness; a wait far above it is more than random noise",
    ),
    "lateness_sigma_ms": (
        "spread of rank lateness (σ)",
        "median over steps of the standard deviation of the ranks' lateness (arrival after the median rank)",
    ),
    "step_cv": (None, "standard deviation over mean of the step time (median over ranks), after the warm-up"),
    "distinct_slowest_ranks": (None, "how many different ranks were a step's slowest rank at least once"),
    "slowest_rank_top_share": (
        None, "share of steps in which the most frequent slowest rank was the slowest"
    ),
    "slowest_rank_expected_share": (
        None, "that share if the role were spread evenly: 1 / ranks considered (persistent culprits left out)"
    ),
    "variation_made_of": (
        None, "per step, each component of the slowest rank above the median rank's, as shares of their sum"
    ),
    "largest_single_rank_saving": (
        None, "the rank whose replacement by its peers' median alone saves most, and the next rank's saving"
    ),
    "skew_share_by_world_size": (
        "slowest − median rank's own work, share of step, by rank count",
        "from the scaling analysis: per step, the slowest rank's own work minus the median rank's, over the "
        "mean step time, for each run's number of ranks",
    ),
    "arrival_basis": (
        None,
        "aligned clocks: arrivals compared on the run's common timeline; collective durations: read from "
        "each rank's time inside each collective (clock offsets between hosts unknown)",
    ),
    "steps": (None, "steps used, after the warm-up"),
    "step_window": (None, "first and last step of the part of the run the finding covers"),
    "onset": (
        "part of the run",
        "a straggler of part of the run: whether it starts or ends, at which step, the share of the run's "
        "time it covers (the severity is over the whole run), and the change-point score (peak CUSUM of "
        "the rank's excess lateness in σ·√steps) with the rank that showed it",
    ),
    # persistent_straggler / input_stall (rank level)
    "last_arriver_share": (None, "share of steps in which a culprit arrived last in its group"),
    "last_arriver_share_expected": (None, "that share if nothing were wrong: 1 / ranks in the group"),
    "median_lateness_ms": (None, "per culprit, the median over steps of its arrival after the other ranks' "
                                 "median; the median over culprits"),
    "lateness_share_of_step": (None, "median lateness over the mean step time"),
    "slower_than_peers_share_of_steps": (
        None,
        "share of steps in which the culprit arrived after the other ranks' median (lowest over culprits)",
    ),
    "score_fleet_over_own": (
        "peers' own work ÷ culprits'",
        "median own work (step minus blocked time) of the other ranks over the culprits'; below 1 the "
        "culprits compute slower (NVIDIA's straggler score)",
    ),
    "component_excess_ms": (
        None, "per step component, the culprits' excess over the other ranks' (ms per step)"
    ),
    "mean_lateness_ms": (
        None, "mean over steps of the arrival after the other ranks' median, pauses included"
    ),
    "cause": (None, "the step component that explains most of the lateness"),
    "cause_explains_share": (
        "share of lateness the cause explains", "the cause component's excess over the mean lateness"
    ),
    "cause_by_rank": (
        "cause per rank",
        "when the culprits' causes differ: each culprit rank's own, the step component that explains most "
        "of its lateness (judged on its own components and lateness, not on the culprits' median)",
    ),
    "downstream_ranks": (
        "ranks late only through the pipeline",
        "culprit ranks whose own step components do not explain their lateness while their point-to-point "
        "waits on another culprit do: per rank, the rank it waited on most, those waits above its stage's "
        "other ranks (ms per step) and the share of its lateness they explain; fixing that rank fixes them",
    ),
    "whatif_bounded_steps": (
        "steps the waiting bounded",
        "steps in which the lateness removed exceeded what the waiting ranks were blocked (or the step "
        "itself), so the saving there was cut to that",
    ),
    "whatif_from_lateness_pct": (
        "saving from the lateness alone",
        "the what-if before its bounds (the waiting, the transfer queue), share of step time; the severity "
        "is the bounded saving",
    ),
    "whatif_exposed_transfer_steps": (
        "steps whose transfers would be exposed",
        "steps in which removing the culprits' lateness would save more than a replay of each group's "
        "transfer queue without it lets the step shrink: the transfers their lateness was hiding would "
        "then be waited on, so the saving there was cut to the replay's",
    ),
    "whatif_before_exposed_transfer_pct": (
        "saving before the transfer-queue bound",
        "the what-if bounded by the waiting but not yet by the replay of the transfer queues, share of "
        "step time; the severity is after that bound",
    ),
    "shared_locality": (None, "what the culprits have in common (node, NUMA, GPU, NIC, leaf) and how "
                              "precisely it singles them out"),
    # topology_contention
    "transfer_excess_share_of_step": (
        None,
        "exposed communication above its baseline (capped at the exposed time), over the total step time",
    ),
    "transfer_inflation_median": (None, "median over collectives of measured transfer ÷ baseline transfer"),
    "transfer_baseline": (
        None, "what transfers are compared with: the run's own quiet instances of the same shape, or the "
              "fabric model of a cluster file (--cluster)"
    ),
    "cross_leaf_excess_share": (
        None, "share of the transfer excess on groups that span more than one leaf switch"
    ),
    "period_runs_z": (
        "clustering of inflated steps (runs-test z)",
        "Wald–Wolfowitz runs test on which steps had inflated transfer: strongly negative means they come "
        "in periods, as with foreign traffic",
    ),
    "period_excess_share": (None, "transfer excess inside those periods, over the total step time"),
    "inflated_step_share": (
        None, "share of steps that lost at least the mode's threshold to excess transfer"
    ),
    # input_stall
    "data_share_of_step": (None, "time in data loading over the total step time"),
    # run metrics
    "size_sweep": (
        "nccl-tests size sweep",
        "an nccl-tests import holds one step per message size, not a training run: per size, the "
        "operation, the bytes, the time (median over ranks) and the algorithm bandwidth (bytes ÷ time, "
        "GB/s); step-time statistics are left out, as they would describe the sizes",
    ),
}

CONFIDENCE_HELP = (
    "share of block-bootstrap resamples over steps in which the loss stays at or above the mode's "
    "threshold, capped by what the run's length can show"
)


def definition(key: str) -> str | None:
    """The one-line definition of an evidence key, or None."""
    entry = GLOSSARY.get(key)
    return entry[1] if entry else None


def label(key: str) -> str:
    """'median_lateness_ms' -> 'median lateness'; the unit goes with the value."""
    entry = GLOSSARY.get(key)
    if entry and entry[0]:
        return entry[0]
    k = key.replace("_ms_", "_")
    for suffix in ("_ms", "_pct"):
        if k.endswith(suffix):
            k = k[: -len(suffix)]
    return " ".join(_WORDS.get(w, w) for w in k.split("_"))


def value(key: str, v: Any, unit: str | None = None) -> str | None:
    """One evidence value as text (None when there is nothing worth showing)."""
    unit = _unit(key) if unit is None else unit
    if _missing(v):
        return None
    if isinstance(v, dict):
        return _mapping(key, v, unit)
    if isinstance(v, list | tuple):
        return _sequence(key, list(v), unit)
    if isinstance(v, int | float):
        return _number(v, unit)
    text = str(v).strip()
    return text or None


def _mapping(key: str, v: dict[str, Any], unit: str) -> str | None:
    if {"attribute", "values"} <= set(v):  # shared_locality: what the culprits have in common
        text = ", ".join(slot_names(str(v["attribute"]), list(v.get("values") or [])))
        extra = []
        if not _missing(v.get("precision")):
            extra.append(f"precision {float(v['precision']):.0%}")
        n = v.get("ranks_with_values")
        if n is not None:
            extra.append(f"{n} {'rank has' if n == 1 else 'ranks have'} it")
        return text + (f" ({', '.join(extra)})" if extra else "")
    present = [x for x in v.values() if not _missing(x)]
    numeric = all(isinstance(x, int | float) and not isinstance(x, bool) for x in present)
    if numeric and unit:
        # A breakdown (ms per component, share per cause): largest first, zeros left out.
        signed = "excess" in key
        items = sorted(((k, float(x)) for k, x in v.items() if not _missing(x)), key=lambda kv: -abs(kv[1]))
        noun = key.split("_", 1)[0]
        prefix = f"{noun} " if noun in _ID_NOUNS and all(str(k).isdigit() for k, _ in items) else ""
        shown = [f"{prefix}{k}: {_number(x, unit, signed)}" if prefix else f"{k} {_number(x, unit, signed)}"
                 for k, x in items if _number(x, unit) not in (_number(0.0, unit), _number(-0.0, unit))]
        return _cut(shown) if shown else None
    parts = []
    for k, x in v.items():
        shown_x = value(str(k), x)
        if shown_x is not None:
            parts.append(f"{label(str(k))} {shown_x}")
    return ", ".join(parts) or None


def _sequence(key: str, v: list[Any], unit: str) -> str | None:
    if not v:
        return None
    if all(isinstance(x, list | tuple) and len(x) == 2 for x in v):  # pairs such as (world size, share)
        return _cut([f"{a}: {_number(b, unit) if isinstance(b, int | float) else b}" for a, b in v])
    texts = [value(key, x, unit if not isinstance(x, dict) else None) for x in v]
    return _cut([t for t in texts if t]) or None


def _cut(items: list[str]) -> str:
    if len(items) > _MAX_ITEMS:
        return "; ".join(items[:_MAX_ITEMS]) + f"; … and {len(items) - _MAX_ITEMS} more"
    return "; ".join(items)


def items(evidence: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) pairs of a finding's evidence, in the detector's order, empties left out."""
    return [(lab, text) for lab, text, _ in described(evidence)]


def described(evidence: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    """(label, value, definition or None) of a finding's evidence, as ``items``."""
    out = []
    for k, v in evidence.items():
        text = value(str(k), v)
        if text is not None:
            out.append((label(str(k)), text, definition(str(k))))
    return out
