"""The statistics of a comparison (tuning/tools/compare/; docs/compare.md): one implementation of each.

Every function takes plain arrays and a seeded numpy Generator where it resamples, so the same
inputs give the same numbers. scipy does the work where it has the tool (bootstrap, Wilcoxon,
Kaplan-Meier, log-rank); what is written here is the glue and the conventions:

    lower is better      every value is a latency (seconds); a ratio < 1 means faster than the baseline
    bootstrap            percentile intervals, 95% by default, resampling seeds (runs); a final
                         kernel's quality also resamples the store's readings of each config
                         (paired_ratio_with_readings), so the store's own noise is in its interval
    paired ratio         the geometric mean of per-seed ratios method / baseline, CI by resampling seeds
    test                 Wilcoxon signed-rank on the per-seed log ratios (exact for small n), then Holm's
                         step-down correction across the tasks of one comparison
    verdict              better / worse only when the CI excludes 1 AND the Holm-adjusted p < alpha;
                         "the same within m" only from an equivalence test with a stated margin m
                         (TOST: both one-sided tests of the log ratios against +-log m below alpha,
                         after Holm); otherwise undecided at this power: not significant is not "the same"
    censoring            runs that never reach the target are right-censored at their length, never
                         dropped: Kaplan-Meier median with its interval, log-rank test between methods
"""
from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import stats

LEVEL = 0.95
RESAMPLES = 2000


# ---- bootstrap ----------------------------------------------------------------------------------
def bootstrap_ci(values, statistic=np.median, rng=None, level: float = LEVEL,
                 resamples: int = RESAMPLES) -> tuple[float, float, float]:
    """(statistic, low, high) of 1-D `values`: a percentile bootstrap over the values (nan
    interval with fewer than 2)."""
    values = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):  # the median of values holding inf (no incumbent yet) interpolates inf - inf
        point = float(statistic(values)) if len(values) else math.nan
    if len(values) < 2:
        return point, math.nan, math.nan
    low, high = curve_band(values[:, None], statistic, rng, level, resamples)
    return point, float(low[0]), float(high[0])


def curve_band(curves, statistic=np.median, rng=None, level: float = LEVEL,
               resamples: int = RESAMPLES) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) per column of `curves` (runs x points): the percentile bootstrap band of the
    statistic over runs, the same resampled runs for every point (a band of whole curves)."""
    curves = np.asarray(curves, dtype=np.float64)
    if curves.shape[0] < 2:
        nan = np.full(curves.shape[1], math.nan)
        return nan, nan.copy()
    rng = rng if rng is not None else np.random.default_rng(0)
    with warnings.catch_warnings(), np.errstate(invalid="ignore"):  # inf (no incumbent yet) - inf inside scipy
        warnings.simplefilter("ignore", category=stats.DegenerateDataWarning)
        warnings.simplefilter("ignore", category=RuntimeWarning)
        result = stats.bootstrap((curves,), statistic, axis=0, n_resamples=resamples, confidence_level=level,
                                 method="percentile", random_state=rng)
    low, high = result.confidence_interval
    return np.atleast_1d(low), np.atleast_1d(high)


# ---- paired comparison ----------------------------------------------------------------------------
def paired_ratio(method, baseline, rng=None, level: float = LEVEL, margin: float | None = None) -> dict:
    """Per-seed latencies (aligned arrays) -> the geometric mean of method/baseline with its paired
    bootstrap CI (resampling seeds) and the Wilcoxon signed-rank p-value of the log ratios; with an
    equivalence `margin`, also `p_same`, the TOST p-value of "within the margin" (tost_p)."""
    method, baseline = np.asarray(method, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    logs = np.log(method / baseline)
    mean, low, high = bootstrap_ci(logs, np.mean, rng, level)
    found = {"n": len(logs), "ratio": math.exp(mean) if len(logs) else math.nan,
             "low": math.exp(low) if math.isfinite(low) else math.nan,
             "high": math.exp(high) if math.isfinite(high) else math.nan, "p": wilcoxon_p(logs)}
    if margin is not None:
        found["p_same"] = tost_p(logs, margin)
    return found


def paired_ratio_with_readings(method, baseline, rng=None, level: float = LEVEL,
                               resamples: int = RESAMPLES, method_scale=None, baseline_scale=None) -> dict:
    """paired_ratio of per-seed latencies that are each the median of a config's readings (lists,
    aligned by seed): the interval resamples the seeds AND, inside each draw, every config's
    readings, so a difference smaller than the readings' own noise does not look certain. The
    point estimate and the Wilcoxon p are paired_ratio's on the medians.

    With `method_scale` / `baseline_scale` (readings of a yardstick timed beside each latency, e.g.
    torch in the same run), each latency is first divided by its yardstick's median: runs made hours
    apart on a host that drifts compare through what was timed with them; both are resampled."""
    rng = rng if rng is not None else np.random.default_rng(0)
    method, baseline = _readings(method), _readings(baseline)
    method_scale = _readings(method_scale) if method_scale is not None else [None] * len(method)
    baseline_scale = _readings(baseline_scale) if baseline_scale is not None else [None] * len(baseline)
    found = paired_ratio([_scaled(r, s, np.median) for r, s in zip(method, method_scale)],
                         [_scaled(r, s, np.median) for r, s in zip(baseline, baseline_scale)], rng, level)
    if len(method) < 2:
        return found

    def resampled_median(readings):
        return small_median(readings[rng.integers(len(readings), size=len(readings))])

    def resampled(latencies, scales, i):
        return _scaled(latencies[i], scales[i], resampled_median)

    draws = []
    for _ in range(resamples):
        seeds = rng.integers(len(method), size=len(method))
        logs = [math.log(resampled(method, method_scale, i) / resampled(baseline, baseline_scale, i)) for i in seeds]
        draws.append(np.mean(logs))
    low, high = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return {**found, "low": math.exp(low), "high": math.exp(high), "readings_resampled": True}


def small_median(values: np.ndarray) -> float:
    """np.median of a short 1-D array, bit for bit (the middle value, or the mean of the middle two
    as (a + b) / 2), without its per-call overhead: the bootstraps call it millions of times."""
    ordered = np.sort(values)
    half = len(ordered) // 2
    if not len(ordered) or np.isnan(ordered[-1]):  # nan sorts last; np.median says nan (or warns on empty)
        return float(np.median(values))
    return float(ordered[half]) if len(ordered) % 2 else float((ordered[half - 1] + ordered[half]) / 2)


def _readings(per_seed) -> list[np.ndarray]:
    return [np.asarray(r, dtype=np.float64) for r in per_seed]


def _scaled(readings, scale, median) -> float:
    """median(readings), over median(scale) where a yardstick was timed beside them."""
    return median(readings) if scale is None else median(readings) / median(scale)


def wilcoxon_p(differences) -> float:
    """Two-sided Wilcoxon signed-rank p-value; 1.0 when every difference is 0, nan with none.
    Zero differences are dropped (Wilcoxon's own convention)."""
    differences = np.asarray(differences, dtype=np.float64)
    if len(differences) == 0:
        return math.nan
    if not np.any(differences):
        return 1.0
    return float(stats.wilcoxon(differences, zero_method="wilcox").pvalue)


def tost_p(differences, margin: float) -> float:
    """Two one-sided tests of equivalence within a ratio `margin` (> 1) on per-seed log ratios: the
    larger of the one-sided t-test p-values of mean > -log(margin) and mean < log(margin); both
    must be small for "the same within margin". nan with fewer than 2 differences; with no
    spread, 0 inside the margin and 1 outside."""
    differences = np.asarray(differences, dtype=np.float64)
    if margin <= 1:
        raise ValueError(f"an equivalence margin is a ratio above 1, got {margin}")
    if len(differences) < 2:
        return math.nan
    bound = math.log(margin)
    if np.ptp(differences) == 0:
        return 0.0 if abs(differences[0]) < bound else 1.0
    above_lower = stats.ttest_1samp(differences, -bound, alternative="greater").pvalue
    below_upper = stats.ttest_1samp(differences, bound, alternative="less").pvalue
    return float(max(above_lower, below_upper))


def holm(p_values) -> list[float]:
    """Holm's step-down adjusted p-values (same order as given; nan stays nan and is not counted)."""
    p = np.asarray(p_values, dtype=np.float64)
    adjusted = np.full(len(p), math.nan)
    known = np.flatnonzero(np.isfinite(p))
    running = 0.0
    for rank, i in enumerate(known[np.argsort(p[known], kind="stable")]):
        running = max(running, min(1.0, (len(known) - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def verdict(low: float, high: float, p_adjusted: float, alpha: float = 1 - LEVEL,
            equivalence_p: float = math.nan, margin: float | None = None) -> str:
    """better / worse (lower latency is better) when the CI excludes 1 and the adjusted test agrees;
    "the same within {margin}" when the (adjusted) equivalence test `equivalence_p` is below alpha
    and the CI lies inside the margin; otherwise undecided."""
    if all(math.isfinite(v) for v in (low, high, p_adjusted)) and p_adjusted < alpha:
        if high < 1:
            return "better"
        if low > 1:
            return "worse"
    if margin is not None and math.isfinite(equivalence_p) and equivalence_p < alpha \
            and 1 / margin < low and high < margin:
        return f"the same within {margin:g}x"
    return "undecided"


# ---- censored times to a target ---------------------------------------------------------------
def kaplan_meier_median(times, reached, level: float = LEVEL) -> dict:
    """Times to a target (measurements or seconds) where `reached` is False for runs censored at
    their time (they stopped first). The Kaplan-Meier median with the interval read off the
    survival function's confidence band; a median the data never reach is None with
    `at_least` the longest time observed."""
    times, reached = np.asarray(times, dtype=np.float64), np.asarray(reached, dtype=bool)
    result = {"n": len(times), "reached": int(reached.sum()), "median": None, "low": None, "high": None,
              "at_least": float(times.max()) if len(times) else math.nan}
    if not reached.any():
        return result
    fit = stats.ecdf(stats.CensoredData(uncensored=times[reached], right=times[~reached]))
    with warnings.catch_warnings():  # "undefined at some observations": where survival is 0 or 1, by design
        warnings.simplefilter("ignore", RuntimeWarning)
        band = fit.sf.confidence_interval(level)
    result["median"] = _first_at_most_half(fit.sf)
    result["low"], result["high"] = _first_at_most_half(band.low), _first_at_most_half(band.high)
    return result


def kaplan_meier_point(times, reached) -> float | None:
    """kaplan_meier_median's median alone, None where the data never reach it: scipy's product-limit
    estimate (stats.ecdf on right-censored data) with the same arithmetic, so the same floats, without
    its confidence band; the bootstraps of a time ratio call it thousands of times."""
    times, reached = np.asarray(times, dtype=np.float64), np.asarray(reached, dtype=bool)
    if not reached.any():
        return None
    observed = np.concatenate((times[reached], times[~reached]))  # deaths first, then losses, as scipy's
    order = np.argsort(observed)
    ordered = observed[order]
    died = np.concatenate((np.ones(reached.sum(), dtype=int), np.zeros((~reached).sum(), dtype=int)))[order]
    unique = np.diff(ordered, prepend=-np.inf, append=np.inf) > 0
    at_risk = np.arange(ordered.size, 0, -1)[unique[:-1]]
    deaths = np.diff(np.cumsum(died)[unique[1:]], prepend=0)
    survival = np.cumprod((at_risk - deaths) / at_risk)
    below = np.flatnonzero(survival <= 0.5)
    return float(ordered[unique[:-1]][below[0]]) if len(below) else None


def _first_at_most_half(function) -> float | None:
    below = np.flatnonzero(np.asarray(function.probabilities) <= 0.5)
    return float(function.quantiles[below[0]]) if len(below) else None


def logrank_p(times_a, reached_a, times_b, reached_b) -> float:
    """Two-sided log-rank p-value between two groups of censored times (nan when no event)."""
    a = [np.asarray(v) for v in (times_a, reached_a)]
    b = [np.asarray(v) for v in (times_b, reached_b)]
    if not (a[1].astype(bool).any() or b[1].astype(bool).any()) or len(a[0]) == 0 or len(b[0]) == 0:
        return math.nan
    data = [stats.CensoredData(uncensored=t[r.astype(bool)], right=t[~r.astype(bool)]) for t, r in (a, b)]
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # identical groups: 0/0, a nan p-value (no test)
        return float(stats.logrank(*data).pvalue)


# ---- the autotuning-methodology score (Willemsen et al. 2024) ---------------------------------------
CUTOFF_START, CUTOFF_END = 0.01, 0.95  # the package's defaults (experiments_defaults.json)


def cutoff_fevals(space, percentile: float) -> int:
    """Measurements a random search needs, in expectation, to reach `percentile` of the way from the
    space's median to its optimum (the package's SearchspaceStatistics.cutoff_point)."""
    ascending = np.sort(np.asarray(space, dtype=np.float64))
    target = ascending[0] + (np.median(ascending) - ascending[0]) * (1 - percentile)
    worst_first = ascending[::-1]
    i = int(np.argmax(worst_first <= target))
    if percentile != 1 and worst_first[i] == ascending[0]:
        i -= 1
    return max(1, math.ceil(i / (len(ascending) + 1 - i)))


def random_search_curve(space, fevals) -> np.ndarray:
    """The expected best of a random search without replacement after each count in `fevals`: the
    order statistic at index round(M (N + 1) / (M + 1)) of the values sorted worst first
    (the package's RandomSearchCalculatedBaseline, on a measurements axis)."""
    worst_first = np.sort(np.asarray(space, dtype=np.float64))[::-1]
    n = len(worst_first)
    return np.array([worst_first[min(n - 1, round(m * (n + 1) / (m + 1)))] for m in np.asarray(fevals, dtype=int)])


def methodology_score(curves, space, rng=None, level: float = LEVEL, start: float = CUTOFF_START,
                      end: float = CUTOFF_END) -> dict:
    """The methodology's performance score of one method on one search space, on the measurements
    axis: P(M) = (baseline(M) - method(M)) / (baseline(M) - optimum), where baseline is the expected
    random search and method the median over runs of the incumbent's true latency after M
    measurements, averaged over M from the `start` to the `end` cutoff (0: random search, 1: the
    optimum at once, < 0: worse than random). `curves` is runs x measurements (column M-1 after M;
    inf, no valid incumbent yet, counts as the worst config), `space` every valid config's true
    latency. The interval resamples runs.
    Where it differs from the package: the axis is measurements, not seconds (the package's time
    axis adds the host's real search overheads), and the runs' curve is their median, not a bagged
    isotonic regression of ranks (which has no seed)."""
    curves, space = np.asarray(curves, dtype=np.float64), np.asarray(space, dtype=np.float64)
    curves = np.where(np.isfinite(curves), curves, space.max())  # no incumbent yet: worth the worst config
    first, last = cutoff_fevals(space, start), min(cutoff_fevals(space, end), curves.shape[1])
    fevals = np.arange(min(first, last), last + 1)
    baseline, optimum = random_search_curve(space, fevals), float(space.min())
    gap = baseline - optimum

    def score(rows) -> float:
        method = np.median(rows[:, fevals - 1], axis=0)
        standardised = np.where(gap > 0, (baseline - method) / np.where(gap > 0, gap, 1.0), 0.0)
        return float(np.mean(standardised))

    point = score(curves)
    low = high = math.nan
    if curves.shape[0] >= 2:
        rng = rng if rng is not None else np.random.default_rng(0)
        resampled = [score(curves[rng.integers(curves.shape[0], size=curves.shape[0])]) for _ in range(RESAMPLES)]
        low, high = (float(v) for v in np.percentile(resampled, [(1 - level) / 2 * 100, (1 + level) / 2 * 100]))
    return {"score": point, "low": low, "high": high, "fevals": (int(fevals[0]), int(fevals[-1]))}
