"""Statistics over paired seeds: the standard error, the paired Wilcoxon signed-rank test,
and Holm's adjustment of a family of its p-values (the replay report's tests against ROFU,
or against the policy `reference_of` names)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from scipy import stats

REFERENCE = "ROFU"


def reference_of(policies: Iterable[str]) -> str:
    """What the Wilcoxon tests compare against: ROFU, else the first ROFU flavour in the
    report's order (e.g. `ROFU-NTK` against `ROFU-exact`), else ROFU all the same."""
    names = list(policies)
    if REFERENCE in names:
        return REFERENCE
    return next((name for name in names if name.startswith("ROFU")), REFERENCE)


def sem(values: np.ndarray) -> float:
    """The standard error of the mean (NaN for fewer than two values)."""
    return float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else math.nan


def paired_wilcoxon(a: dict[int, float], b: dict[int, float]) -> float:
    """The two-sided Wilcoxon signed-rank p-value of seed -> value `a` against `b`, paired
    on their common seeds (NaN for fewer than two; 1 where every pair ties)."""
    common = sorted(set(a) & set(b))
    diffs = np.array([a[s] - b[s] for s in common])
    if len(common) < 2:
        return math.nan
    if np.allclose(diffs, 0):
        return 1.0
    return float(stats.wilcoxon(diffs, zero_method="zsplit").pvalue)


def holm(p_values: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment of a family of p-values (NaN ones are not tested and
    stay NaN): the i-th smallest of m becomes max over j <= i of min(1, (m - j + 1) p_(j))."""
    tested = sorted((p, name) for name, p in p_values.items() if not math.isnan(p))
    adjusted, running = {}, 0.0
    for index, (p, name) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - index) * p))
        adjusted[name] = running
    return {name: adjusted.get(name, math.nan) for name in p_values}
