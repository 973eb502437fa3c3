"""A finding's evidence, written for a person: labels in words, values with units and sensible rounding.

The diagnosis keeps its evidence as a JSON mapping (``Finding.evidence``: exact numbers for scripts).
A report reader wants ``median lateness 21.51 ms`` and ``last arriver share 99.4%``, not
``median_lateness_ms = 21.506565``. The unit comes from the key's name, which the detectors use
consistently: ``*_ms`` milliseconds, ``*share*``/``precision`` fractions shown as percent, ``*_pct``
percent, ``*inflation*`` a factor, ``*_z`` a z-score. Nested mappings take their parent's unit
(``component_excess_ms = {compute: 21.5, ...}`` is ms per component) and become short lists; values
that are missing (``None``/NaN) or round to zero in an "excess" breakdown are left out, and long lists
are cut to a few items with a count of the rest.
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


def label(key: str) -> str:
    """'median_lateness_ms' -> 'median lateness'; the unit goes with the value."""
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
    out = []
    for k, v in evidence.items():
        text = value(str(k), v)
        if text is not None:
            out.append((label(str(k)), text))
    return out
