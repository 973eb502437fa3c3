"""Small statistics for study tables: mean with a Student-t 95% CI, paired relative differences.

Repeats are few (3–10), so the CI uses the t distribution (quantiles tabulated below; scipy is not a
dependency). With one repeat there is no CI (reported as null), never a made-up one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# two-sided 95% Student-t quantiles t_{0.975, df}
_T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    25: 2.060,
    30: 2.042,
    40: 2.021,
    60: 2.000,
    120: 1.980,
}


def t975(df: int) -> float:
    if df < 1:
        return math.nan
    keys = sorted(_T975)
    for k in keys:
        if df <= k:
            return _T975[k] if df == k else _T975[max(x for x in keys if x <= df)]
    return 1.960


def mean_ci(values: Sequence[float]) -> tuple[float, tuple[float, float] | None]:
    """Mean and its 95% CI (None when fewer than two values)."""
    x = np.asarray(values, dtype=float)
    m = float(x.mean())
    if x.size < 2:
        return m, None
    half = t975(x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return m, (m - half, m + half)


def paired_delta(base: Sequence[float], other: Sequence[float]) -> tuple[float, tuple[float, float] | None]:
    """Mean relative difference (other/base − 1) over paired repeats (same seeds), with a 95% CI."""
    b = np.asarray(base, dtype=float)
    o = np.asarray(other, dtype=float)
    n = min(b.size, o.size)
    return mean_ci(list(o[:n] / b[:n] - 1.0))
