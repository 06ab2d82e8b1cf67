"""The statistics of a holdout comparison: per-group means, the lift, an anytime-valid test
and the sample-ratio check. Pure functions of per-unit outcomes.

The unit of analysis is the unit of assignment (`rofu.service.deciding.holdout`): a
request's `unit_id`, or the decision itself. A unit's outcome is the mean of its values
(its rewards, or one guardrail metric), so a heavy user counts once, as the randomisation
does, and units are independent draws.

- Each group's mean has a 95% normal interval, and the difference (rofu - holdout) one
  with the unpooled standard error sqrt(s_r^2/n_r + s_h^2/n_h). These hold for one look
  at a sample size fixed in advance.
- The **sequential test** stays valid however often the report is read: an asymptotic
  confidence sequence for the difference (Waudby-Smith, Arbour, Sinha, Kennedy and Ramdas,
  "Time-uniform central limit theory and asymptotic confidence sequences", Ann. Statist.
  2024, the two-sample case): with t = n_r + n_h units and V = t (s_r^2/n_r + s_h^2/n_h),

      difference +- sqrt(V (2 (t rho^2 + 1) / (t^2 rho^2)) log(sqrt(t rho^2 + 1) / alpha))

  covers the true difference at every t at once with probability about 1 - alpha, so
  stopping the first time it excludes 0 keeps the error rate at alpha. rho is fixed in
  advance (never from the data), tightest near `HORIZON` units. Its p-value is the
  smallest alpha whose sequence excludes 0 now.
- The **sample-ratio check** compares the units per group with the configured share (a
  chi-squared test, one degree of freedom); p below `SRM_ALPHA` means the split is off
  (units lost to one group, a changed share or salt mid-experiment, a bot) and the
  comparison is not to be trusted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054
ALPHA = 0.05
HORIZON = 10_000  # units at which the confidence sequence is tightest
SRM_ALPHA = 0.001


@dataclass(frozen=True)
class Interval:
    """An estimate with a two-sided 95% interval; None where it cannot be computed."""

    estimate: float | None
    low: float | None
    high: float | None

    @classmethod
    def none(cls) -> Interval:
        return cls(None, None, None)


@dataclass(frozen=True)
class GroupSummary:
    """A group's units: how many, the mean of their outcomes and its interval."""

    units: int
    mean: Interval
    sd: float | None


@dataclass(frozen=True)
class Comparison:
    """rofu against the holdout on one outcome."""

    rofu: GroupSummary
    holdout: GroupSummary
    difference: Interval  # rofu - holdout, fixed-sample 95%
    lift: Interval  # (rofu - holdout) / |holdout|, delta method
    sequence: Interval  # the anytime-valid 95% confidence sequence for the difference
    p_value: float | None  # the anytime-valid p-value of "no difference"

    @property
    def significant(self) -> bool:
        """Whether the confidence sequence excludes 0 now."""
        low, high = self.sequence.low, self.sequence.high
        return low is not None and high is not None and (low > 0 or high < 0)


def summarise(values: Sequence[float]) -> GroupSummary:
    """The units' count, mean with a 95% normal interval, and standard deviation."""
    n = len(values)
    if n == 0:
        return GroupSummary(0, Interval.none(), None)
    mean = math.fsum(values) / n
    if n < 2:
        return GroupSummary(n, Interval(mean, None, None), None)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = Z95 * sd / math.sqrt(n)
    return GroupSummary(n, Interval(mean, mean - half, mean + half), sd)


def compare(rofu: Sequence[float], holdout: Sequence[float]) -> Comparison:
    """rofu's units against the holdout's on one outcome (per-unit values)."""
    r, h = summarise(rofu), summarise(holdout)
    if r.sd is None or h.sd is None or r.mean.estimate is None or h.mean.estimate is None:
        return Comparison(r, h, Interval.none(), Interval.none(), Interval.none(), None)
    var_r, var_h = r.sd**2 / r.units, h.sd**2 / h.units
    difference = r.mean.estimate - h.mean.estimate
    se = math.sqrt(var_r + var_h)
    fixed = Interval(difference, difference - Z95 * se, difference + Z95 * se)
    return Comparison(
        r,
        h,
        fixed,
        _lift(r.mean.estimate, h.mean.estimate, var_r, var_h),
        *_sequence(difference, se, r.units + h.units),
    )


def _lift(mean_r: float, mean_h: float, var_r: float, var_h: float) -> Interval:
    """(mean_r - mean_h) / |mean_h| with a delta-method 95% interval; none when the
    holdout's mean is 0."""
    if mean_h == 0:
        return Interval.none()
    lift = (mean_r - mean_h) / abs(mean_h)
    se = math.sqrt(var_r / mean_h**2 + var_h * mean_r**2 / mean_h**4)
    return Interval(lift, lift - Z95 * se, lift + Z95 * se)


def rho_squared(alpha: float = ALPHA, horizon: int = HORIZON) -> float:
    """The confidence sequence's rho^2 that makes it tightest at `horizon` units."""
    a = -2.0 * math.log(alpha)
    return (a + math.log(a + 1.0)) / horizon


def _sequence(difference: float, se: float, t: int) -> tuple[Interval, float | None]:
    """The anytime-valid 95% interval for the difference at t units, and its p-value."""
    r2 = rho_squared()
    variance = se**2 * t  # V: the per-unit variance of the difference's estimator
    scale = variance * 2.0 * (t * r2 + 1.0) / (t**2 * r2)
    half = math.sqrt(scale * math.log(math.sqrt(t * r2 + 1.0) / ALPHA))
    if variance == 0:
        p = 1.0 if difference == 0 else 0.0
    else:
        p = min(1.0, math.sqrt(t * r2 + 1.0) * math.exp(-(difference**2) / scale))
    return Interval(difference, difference - half, difference + half), p


@dataclass(frozen=True)
class SampleRatio:
    """The observed split of units against the configured share."""

    expected_holdout_share: float
    observed_holdout_share: float | None
    p_value: float | None

    @property
    def mismatch(self) -> bool:
        """Whether the split is off (p below `SRM_ALPHA`)."""
        return self.p_value is not None and self.p_value < SRM_ALPHA


def sample_ratio(rofu_units: int, holdout_units: int, share: float) -> SampleRatio:
    """The chi-squared test (1 degree of freedom) of the units' split against `share`."""
    n = rofu_units + holdout_units
    if n == 0 or not 0.0 < share < 1.0:
        return SampleRatio(share, None if n == 0 else holdout_units / n, None)
    expected_h, expected_r = n * share, n * (1.0 - share)
    chi2 = (holdout_units - expected_h) ** 2 / expected_h + (rofu_units - expected_r) ** 2 / (
        expected_r
    )
    return SampleRatio(share, holdout_units / n, math.erfc(math.sqrt(chi2 / 2.0)))
