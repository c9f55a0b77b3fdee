"""Is a series growing? A least-squares slope with a confidence interval that knows
the samples are not independent, and a verdict that needs the growth to be both
certain and large enough to matter.

A process's RSS or open fds sampled every minute is a noisy series: fds rise and fall
with the children in flight, RSS with the allocator's arenas. Two ways to be wrong:
calling noise a leak (a CI run that fails at random), and missing a slow leak under
the noise. So a series is called a leak only when the whole 95% confidence interval of
its slope lies above a tolerance (growth too small to matter over a day's run, stated
per series) and the growth it certainly makes over the judged window exceeds a floor
(a short run's allocator steps and warm-up creep are real growth, but not a leak).
The interval widens for autocorrelated residuals (a series that wanders
slowly looks more certain than it is): the effective sample size is
n·(1 − r₁)/(1 + r₁), r₁ the lag-1 autocorrelation of the residuals (Santer et al.,
2000, J. Geophys. Res. 105(D6)), and Student's t for n_eff − 2 degrees of freedom.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

# Student's t, two-sided 95% (the 0.975 quantile), for 1..30 degrees of freedom
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
MIN_SAMPLES = 6  # fewer after the warm-up: not judged


def t975(dof: float) -> float:
    """The 0.975 quantile of Student's t (dof rounded down; within 0.1% past 30)."""
    d = max(1, int(dof))
    return _T975[d - 1] if d <= len(_T975) else 1.96 + 2.4 / d


@dataclass
class Fit:
    n: int
    slope: float  # units per second
    low: float  # 95% confidence interval of the slope, units per second
    high: float
    first: float  # the fitted line at the first and the last sample
    last: float
    span: float  # seconds from the first sample to the last
    r1: float  # lag-1 autocorrelation of the residuals
    n_eff: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def fit(ts: Sequence[float], ys: Sequence[float]) -> Fit | None:
    """Least-squares line through (ts, ys), its slope's 95% interval widened for
    autocorrelated residuals. None with fewer than MIN_SAMPLES points or one instant."""
    n = len(ts)
    if n < MIN_SAMPLES or n != len(ys):
        return None
    mt, my = sum(ts) / n, sum(ys) / n
    sxx = sum((t - mt) ** 2 for t in ts)
    if sxx <= 0:
        return None
    slope = sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / sxx
    icept = my - slope * mt
    res = [y - (icept + slope * t) for t, y in zip(ts, ys, strict=True)]
    ssr = sum(e * e for e in res)
    r1 = sum(a * b for a, b in zip(res, res[1:], strict=False)) / ssr if ssr > 0 else 0.0
    n_eff = n * (1 - r1) / (1 + r1) if r1 > 0 else float(n)
    n_eff = max(3.0, min(float(n), n_eff))
    se = math.sqrt(ssr / (n_eff - 2) / sxx)
    half = t975(n_eff - 2) * se
    return Fit(n, slope, slope - half, slope + half, icept + slope * ts[0],
               icept + slope * ts[-1], ts[-1] - ts[0], r1, n_eff)


def verdict(f: Fit | None, tolerance_per_s: float, floor: float) -> str:
    """"leak" if the slope is certainly above `tolerance_per_s` and certainly adds more
    than `floor` over the window; "flat" if it is certainly at most `tolerance_per_s`;
    "small" if it may be more, but certainly adds at most `floor` over the window (too
    little to judge in a run this short); "unclear" between those (a longer run would
    tell); "too few samples" without a fit."""
    if f is None:
        return "too few samples"
    if f.low > tolerance_per_s and f.low * f.span > floor:
        return "leak"
    if f.high <= tolerance_per_s:
        return "flat"
    if f.high * f.span <= floor:
        return "small"
    return "unclear"
