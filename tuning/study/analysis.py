"""The pre-registered comparison of a study's arms: pure statistics on per-block results (numpy, scipy).

A block is one (task, seed) run of every arm on one machine; it gives each arm a final latency
(seconds, > 0) and names its host kind. The unit of analysis is the per-block log ratio
log(latency_arm / latency_baseline); a ratio < 1 means the arm is faster.

    estimate      the geometric-mean ratio exp(mean log ratio), with a t-interval on the mean at
                  level 1 - alpha (exp'd); with two or more host kinds the headline is the
                  stratified estimate (host kind as stratum, weighted by stratum size: the same
                  point, a t-interval on the pooled within-stratum variance, df = n - strata)
    tests         difference: two-sided one-sample t-test of the log ratios against 0;
                  equivalence: TOST against +-log(margin), p = the larger one-sided p
    families      the confirmatory claims and the controls are two Holm families
    looks         below min_blocks complete blocks every estimate is withheld; with interim
                  "obrien_fleming" before planned_blocks, the level of this look is the
                  Lan-DeMets O'Brien-Fleming spending alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t))
                  (exact for one interim look). With a declared schedule `looks` (block counts,
                  the last = planned_blocks) a table is the latest scheduled look, over the first
                  n_k complete blocks in the order given, at the exact group-sequential level of
                  that look: the boundaries c_1..c_k with P(|Z_1| < c_1, ..., |Z_k| >= c_k) =
                  alpha(t_k) - alpha(t_{k-1}), corr(Z_i, Z_j) = sqrt(t_i / t_j), so that every look
                  together spends alpha
    verdict       difference: "arm faster" / "arm slower" when the interval excludes 1 and the Holm
                  p < the look's alpha, else "undecided"; equivalence: "equivalent within margin M"
                  when the Holm TOST p < the look's alpha, else "not shown equivalent"
    measures      a claim is on the final latency by default; `measure: to_target` is on the
                  measurements an arm made before it first measured a config within the block's
                  target, `to_target_s` on its tuning seconds to then. Those are censored (an arm
                  that never reached the target is counted at all it spent: at least that), so
                  their rows are distribution-free: the median log ratio, the sign test (two-sided;
                  for equivalence, the larger of two one-sided sign tests against -+log(margin))
                  and the order-statistic interval of the median; a block where both arms were
                  censored says nothing of the ratio and is left out of the row. Counting a
                  censored arm at its spend pulls its ratio toward 1: conservative for a difference.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

KINDS = ("difference", "equivalence")
MEASURES = ("final", "to_target", "to_target_s")  # what a claim compares (module docstring)
MEASURE_WORDS = {"final": "", "to_target": " (measurements to target)", "to_target_s": " (tuning seconds to target)"}
INTERIMS = ("none", "obrien_fleming")
WITHHELD = "withheld: n < min_blocks"


@dataclass(frozen=True)
class Claim:
    """One pre-registered comparison of `arm` against `baseline`: kind "difference" (two-sided, margin
    None) or "equivalence" (TOST: the geometric-mean ratio within [1/margin, margin], margin > 1)."""

    arm: str
    baseline: str
    kind: str
    margin: float | None = None
    measure: str = "final"  # MEASURES: the final latency, or the measurements / tuning seconds to the target


@dataclass(frozen=True)
class Plan:
    """The analysis fixed before the data: confirmatory claims and controls (two Holm families), the
    family-wise alpha, the blocks needed before any estimate is shown (min_blocks) or planned in all,
    and the interim rule ("none" or "obrien_fleming")."""

    claims: tuple[Claim, ...]
    controls: tuple[Claim, ...]
    alpha: float
    min_blocks: int
    planned_blocks: int
    interim: str
    looks: tuple[int, ...] = ()  # a declared look schedule (block counts); () : a look whenever printed


@dataclass(frozen=True)
class Estimate:
    """A ratio with its interval and test: exp(log_mean) with exp(log_mean -+ t * se) at level
    1 - alpha, on df degrees of freedom; p is the claim's p-value (two-sided t or TOST)."""

    ratio: float
    low: float
    high: float
    p: float
    log_mean: float
    se: float
    df: int


@dataclass(frozen=True)
class HostKind:
    """One host kind's blocks: their count and geometric-mean ratio (None where withheld)."""

    kind: str
    n: int
    ratio: float | None


@dataclass(frozen=True)
class Row:
    """One claim's result. `headline` ("plain" or "stratified") names the estimate that ratio, low,
    high and p come from; p_adjusted is Holm's within the row's family (None until family_table sets
    it); every number is None when `withheld` says why."""

    claim: Claim
    n: int
    hosts: tuple[HostKind, ...]
    alpha: float
    headline: str
    plain: Estimate | None
    stratified: Estimate | None
    heterogeneity_p: float | None
    p_adjusted: float | None
    verdict: str
    withheld: str | None = None
    family: str = "claims"

    @property
    def estimate(self) -> Estimate | None:
        """The headline estimate."""
        return self.stratified if self.headline == "stratified" else self.plain


@dataclass(frozen=True)
class Table:
    """A look at the study: the claims' and the controls' rows, the complete blocks used (n_blocks)
    and the ids of those left out as incomplete, the information fraction t = n / planned_blocks
    (capped at 1), the look ("final", "interim" or "early": before planned_blocks with no interim
    rule) and the alpha the verdicts used at this look."""

    plan: Plan
    claims: tuple[Row, ...]
    controls: tuple[Row, ...]
    n_blocks: int
    incomplete: tuple[str, ...]
    information: float
    look: str
    look_alpha: float
    withheld: bool


# ---- plan -----------------------------------------------------------------------------------------
def plan_problems(plan: Plan) -> list[str]:
    """Every problem with `plan`, each naming its key (analysis.alpha, analysis.claims[0].margin, ...);
    empty when the plan can be analysed."""
    problems: list[str] = []
    alpha = plan.alpha
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 < alpha < 0.5:
        problems.append(f"analysis.alpha: {alpha!r} is not in (0, 0.5)")
    if not _is_int(plan.min_blocks) or plan.min_blocks < 2:
        problems.append(f"analysis.min_blocks: {plan.min_blocks!r} is not an integer >= 2")
    if not _is_int(plan.planned_blocks) or (_is_int(plan.min_blocks) and plan.planned_blocks < plan.min_blocks):
        problems.append(f"analysis.planned_blocks: {plan.planned_blocks!r} is not an integer >= min_blocks "
                        f"({plan.min_blocks!r})")
    if plan.interim not in INTERIMS:
        problems.append(f"analysis.interim: {plan.interim!r} is not one of {', '.join(INTERIMS)}")
    if not plan.claims:
        problems.append("analysis.claims: no confirmatory claim")
    problems.extend(_look_problems(plan))
    for family in ("claims", "controls"):
        for i, claim in enumerate(getattr(plan, family)):
            problems.extend(claim_problems(claim, f"analysis.{family}[{i}]"))
    return problems


def _look_problems(plan: Plan) -> list[str]:
    looks = plan.looks
    if not looks:
        return []
    if not all(_is_int(n) for n in looks) or list(looks) != sorted(set(looks)):
        return [f"analysis.looks: block counts in increasing order, got {list(looks)!r}"]
    problems = []
    if plan.interim != "obrien_fleming":
        problems.append(f"analysis.looks: a look schedule spends alpha by interim obrien_fleming, not {plan.interim!r}")
    if _is_int(plan.min_blocks) and looks[0] < plan.min_blocks:
        problems.append(f"analysis.looks: the first look ({looks[0]} blocks) is before min_blocks ({plan.min_blocks})")
    if looks[-1] != plan.planned_blocks:
        problems.append(f"analysis.looks: the last look is at the planned {plan.planned_blocks} blocks, not {looks[-1]}")
    return problems


def claim_problems(claim: Claim, key: str = "claim") -> list[str]:
    """The problems with one claim, each naming `key`.field."""
    problems: list[str] = []
    if not claim.arm or not claim.baseline:
        problems.append(f"{key}.arm: arm and baseline must both be named")
    elif claim.arm == claim.baseline:
        problems.append(f"{key}.arm: arm {claim.arm!r} is its own baseline")
    if claim.kind not in KINDS:
        problems.append(f"{key}.kind: {claim.kind!r} is not one of {', '.join(KINDS)}")
    elif claim.kind == "equivalence":
        margin = claim.margin
        if margin is None or not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin <= 1:
            problems.append(f"{key}.margin: an equivalence claim needs a finite margin > 1, not {margin!r}")
    elif claim.margin is not None:
        problems.append(f"{key}.margin: a difference claim takes no margin (None), not {claim.margin!r}")
    if claim.measure not in MEASURES:
        problems.append(f"{key}.measure: {claim.measure!r} is not one of {', '.join(MEASURES)}")
    return problems


def claim_plan(claim: Claim) -> dict:
    """A claim as a plan's hash reads it: the measure named only where it is not the final latency."""
    plain = dataclasses.asdict(claim)
    if claim.measure == "final":
        del plain["measure"]
    return plain


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


# ---- one claim ----------------------------------------------------------------------------------
def ratio_row(arm_latencies: Sequence[float], baseline_latencies: Sequence[float], hosts: Sequence[str],
              claim: Claim, alpha: float) -> Row:
    """The row of `claim` from latencies paired by block (position i of each sequence is block i, run
    on host kind hosts[i]); intervals at level 1 - alpha, p unadjusted (p_adjusted = p), the verdict at
    alpha. Raises ValueError on fewer than 2 blocks, unequal lengths or a latency that is not > 0."""
    problems = claim_problems(claim)
    if problems:
        raise ValueError("; ".join(problems))
    if not 0 < alpha < 1:
        raise ValueError(f"alpha {alpha!r} is not in (0, 1)")
    arm = np.asarray(arm_latencies, dtype=np.float64)
    base = np.asarray(baseline_latencies, dtype=np.float64)
    kinds = [str(h) for h in hosts]
    if not (arm.ndim == base.ndim == 1 and len(arm) == len(base) == len(kinds)):
        raise ValueError(f"{len(arm)} arm, {len(base)} baseline latencies and {len(kinds)} host kinds: "
                         "one of each per block")
    if len(arm) < 2:
        raise ValueError(f"{len(arm)} block(s): a ratio's interval needs at least 2")
    for name, values in (("arm", arm), ("baseline", base)):
        if not np.all(np.isfinite(values) & (values > 0)):
            raise ValueError(f"{name} latencies must be finite and > 0")
    logs = np.log(arm) - np.log(base)
    n = len(logs)
    names = sorted(set(kinds))
    groups = [logs[[k == name for k in kinds]] for name in names]
    host_rows = tuple(HostKind(name, len(g), float(np.exp(g.mean()))) for name, g in zip(names, groups))
    plain = _estimate(float(logs.mean()), float(logs.std(ddof=1)) / math.sqrt(n), n - 1, claim, alpha)
    stratified = heterogeneity = None
    if len(groups) >= 2 and n - len(groups) >= 1:
        within = sum(float(((g - g.mean()) ** 2).sum()) for g in groups)
        df = n - len(groups)
        pooled_sd = math.sqrt(within / df)
        stratified = _estimate(float(sum(len(g) * g.mean() for g in groups) / n), pooled_sd / math.sqrt(n), df,
                               claim, alpha)
        between = sum(len(g) * (float(g.mean()) - float(logs.mean())) ** 2 for g in groups)
        heterogeneity = _anova_p(between, len(groups) - 1, within, df)
    headline = "stratified" if stratified is not None else "plain"
    chosen = stratified if stratified is not None else plain
    return Row(claim=claim, n=n, hosts=host_rows, alpha=alpha, headline=headline, plain=plain,
               stratified=stratified, heterogeneity_p=heterogeneity, p_adjusted=chosen.p,
               verdict=_verdict(claim, chosen, chosen.p, alpha))


def censored_row(arm: Sequence[tuple[float, bool]], baseline: Sequence[tuple[float, bool]], hosts: Sequence[str],
                 claim: Claim, alpha: float) -> Row:
    """The row of a claim on a censored measure (module docstring, "measures") from (value, censored)
    pairs by block: values > 0, a censored one the arm's whole spend. Blocks where both are censored
    are left out (n counts the rest). ValueError on unequal lengths or a value not finite and > 0."""
    if not len(arm) == len(baseline) == len(hosts):
        raise ValueError(f"{len(arm)} arm, {len(baseline)} baseline values and {len(hosts)} host kinds")
    kept = [(a, b, h) for a, b, h in zip(arm, baseline, hosts) if not (a[1] and b[1])]
    for (a, _), (b, _), _ in kept:
        if not (math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0):
            raise ValueError("values must be finite and > 0")
    logs = np.array([math.log(a) - math.log(b) for (a, _), (b, _), _ in kept])
    kinds = [h for _, _, h in kept]
    host_rows = tuple(HostKind(kind, kinds.count(kind), float(np.exp(np.median(logs[[k == kind for k in kinds]]))))
                      for kind in sorted(set(kinds)))
    n = len(logs)
    if n == 0:
        estimate = Estimate(ratio=math.nan, low=0.0, high=math.inf, p=1.0, log_mean=math.nan, se=math.nan, df=0)
    else:
        low, high = _median_interval(np.sort(logs), alpha)
        estimate = Estimate(ratio=math.exp(float(np.median(logs))), low=math.exp(low), high=math.exp(high),
                            p=_sign_p(logs, claim), log_mean=float(np.median(logs)), se=math.nan, df=n - 1)
    return Row(claim=claim, n=n, hosts=host_rows, alpha=alpha, headline="plain", plain=estimate, stratified=None,
               heterogeneity_p=None, p_adjusted=estimate.p, verdict=_verdict(claim, estimate, estimate.p, alpha))


def _median_interval(ordered: np.ndarray, alpha: float) -> tuple[float, float]:
    """The distribution-free interval of the median at level >= 1 - alpha: the k-th smallest and k-th
    largest, k the largest with P(Binomial(n, 1/2) < k) <= alpha / 2; (-inf, inf) where n is too small."""
    n = len(ordered)
    k = 0
    while k + 1 <= n and stats.binom.cdf(k, n, 0.5) <= alpha / 2:
        k += 1
    if k == 0:
        return -math.inf, math.inf
    return float(ordered[k - 1]), float(ordered[n - k])


def _sign_p(logs: np.ndarray, claim: Claim) -> float:
    """The sign test's p: two-sided against 0 for a difference; for equivalence the larger of the
    one-sided tests of median <= -log(margin) and median >= +log(margin) (ties with the bound left out)."""
    def one_sided(successes: int, trials: int) -> float:  # P(X >= successes), X ~ Binomial(trials, 1/2)
        return float(stats.binom.sf(successes - 1, trials, 0.5)) if trials else 1.0

    if claim.kind == "equivalence":
        bound = math.log(float(claim.margin))  # type: ignore[arg-type]  # claim_problems: margin > 1
        above_low = one_sided(int((logs > -bound).sum()), int((logs != -bound).sum()))
        below_high = one_sided(int((logs < bound).sum()), int((logs != bound).sum()))
        return max(above_low, below_high)
    nonzero = logs[logs != 0]
    if len(nonzero) == 0:
        return 1.0
    return float(stats.binomtest(int((nonzero > 0).sum()), len(nonzero), 0.5).pvalue)


def described_ratio(arm: Sequence[float], baseline: Sequence[float], alpha: float) -> tuple[float, float, float]:
    """(the geometric mean of arm / baseline paired by position, its t interval's low and high at
    1 - alpha): a description of a quantity no claim is about, with no test. ValueError on fewer than 2
    pairs, unequal lengths or a value that is not finite and > 0."""
    a, b = np.asarray(arm, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
        raise ValueError(f"{len(a)} arm and {len(b)} baseline values: at least 2 pairs")
    if not (np.all(np.isfinite(a) & (a > 0)) and np.all(np.isfinite(b) & (b > 0))):
        raise ValueError("values must be finite and > 0")
    logs = np.log(a) - np.log(b)
    mean, se = float(logs.mean()), float(logs.std(ddof=1)) / math.sqrt(len(logs))
    half = float(stats.t.ppf(1 - alpha / 2, len(logs) - 1)) * se
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def _estimate(log_mean: float, se: float, df: int, claim: Claim, alpha: float) -> Estimate:
    """The interval at 1 - alpha and the claim's p; se == 0 (identical log ratios) gives a point interval
    and p 0 or 1 by where the mean lies."""
    half = float(stats.t.ppf(1 - alpha / 2, df)) * se
    if claim.kind == "difference":
        if se > 0:
            p = float(2 * stats.t.sf(abs(log_mean) / se, df))
        else:
            p = 0.0 if log_mean != 0 else 1.0
    else:
        bound = math.log(float(claim.margin))  # type: ignore[arg-type]  # claim_problems: margin > 1
        if se > 0:
            p_above_low = float(stats.t.sf((log_mean + bound) / se, df))  # H0: mean <= -log M
            p_below_high = float(stats.t.cdf((log_mean - bound) / se, df))  # H0: mean >= +log M
            p = max(p_above_low, p_below_high)
        else:
            p = 0.0 if abs(log_mean) < bound else 1.0
    return Estimate(ratio=math.exp(log_mean), low=math.exp(log_mean - half), high=math.exp(log_mean + half),
                    p=min(1.0, p), log_mean=log_mean, se=se, df=df)


def _anova_p(between: float, df_between: int, within: float, df_within: int) -> float:
    """The one-way ANOVA F test's p-value of the host kinds' mean log ratios."""
    if within <= 0:
        return 0.0 if between > 0 else 1.0
    f = (between / df_between) / (within / df_within)
    return float(stats.f.sf(f, df_between, df_within))


def _verdict(claim: Claim, estimate: Estimate, p_adjusted: float, alpha: float) -> str:
    if claim.kind == "equivalence":
        return f"equivalent within margin {_g(claim.margin)}" if p_adjusted < alpha else "not shown equivalent"
    if p_adjusted < alpha and estimate.high < 1:
        return "arm faster"
    if p_adjusted < alpha and estimate.low > 1:
        return "arm slower"
    return "undecided"


# ---- the family table ---------------------------------------------------------------------------
def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order: the i-th smallest p times (m - i + 1),
    made non-decreasing, capped at 1."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        adjusted[i] = running
    return adjusted


def obrien_fleming_alpha(alpha: float, information: float) -> float:
    """The Lan-DeMets O'Brien-Fleming alpha spent by information fraction t: 2 - 2 Phi(z_{1-alpha/2} /
    sqrt(t)); alpha itself at t >= 1, 0 at t <= 0."""
    if information <= 0:
        return 0.0
    if information >= 1:
        return alpha
    return float(2 * stats.norm.sf(stats.norm.isf(alpha / 2) / math.sqrt(information)))


def group_sequential_levels(alpha: float, fractions: Sequence[float]) -> list[float]:
    """The nominal two-sided level of each look at information fractions t_1 < ... < t_K (t_K = 1 at the
    last planned look) under Lan-DeMets O'Brien-Fleming spending: look k rejects when |Z_k| >= c_k, with
    c_k solving P(|Z_1| < c_1, ..., |Z_{k-1}| < c_{k-1}, |Z_k| >= c_k) = alpha(t_k) - alpha(t_{k-1}).
    Computed by numerical integration of the score process B(t) = Z(t) sqrt(t), a Brownian motion,
    over the region still open after each look (deterministic; the level is 2 (1 - Phi(c_k)))."""
    levels: list[float] = []
    spent, last = 0.0, None
    for t in fractions:
        target = obrien_fleming_alpha(alpha, t) - spent
        spent += target
        bound = float(stats.norm.isf(target / 2)) if last is None else _next_bound(last, t, target)
        last = _still_open(last, t, bound)
        levels.append(float(2 * stats.norm.sf(bound)))
    return levels


@dataclass(frozen=True)
class _OpenRegion:
    """The score process B at a look's time t, on a grid over the region no look has crossed yet, with
    its (sub-probability) density there."""

    t: float
    grid: np.ndarray
    density: np.ndarray


def _next_bound(last: _OpenRegion, t: float, target: float) -> float:
    """The |Z| bound at time t that a path still open at `last` crosses with probability `target`."""
    from scipy.optimize import brentq

    step = math.sqrt(t - last.t)
    weighted = last.density * _simpson_weights(last.grid)

    def crossing(c: float) -> float:
        edge = c * math.sqrt(t)
        beyond = stats.norm.cdf((-edge - last.grid) / step) + stats.norm.sf((edge - last.grid) / step)
        return float(np.dot(weighted, beyond)) - target

    return float(brentq(crossing, 0.01, 12.0, xtol=1e-12))


def _still_open(last: _OpenRegion | None, t: float, bound: float) -> _OpenRegion:
    edge = bound * math.sqrt(t)
    grid = np.linspace(-edge, edge, GRID_POINTS)
    if last is None:
        return _OpenRegion(t, grid, stats.norm.pdf(grid / math.sqrt(t)) / math.sqrt(t))
    step = math.sqrt(t - last.t)
    kernel = stats.norm.pdf((grid[:, None] - last.grid[None, :]) / step) / step
    return _OpenRegion(t, grid, kernel @ (last.density * _simpson_weights(last.grid)))


GRID_POINTS = 801  # odd, for Simpson's rule: the levels agree with 2001 points to ~1e-7


def _simpson_weights(grid: np.ndarray) -> np.ndarray:
    """Simpson's rule on an evenly spaced grid of an odd number of points: the integral is the dot
    product of these weights with the values."""
    weights = np.ones(len(grid))
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    return weights * (grid[1] - grid[0]) / 3


def family_table(plan: Plan, blocks: Sequence[Mapping]) -> Table:
    """The look at `blocks` (each {"block": id, "host_kind": str, "final": {arm: latency}}) under `plan`.
    A block is complete when every arm the plan names has a finite latency; the others are left out and
    listed. Raises ValueError on a plan with problems, a repeated block id, a block without a host kind
    or a latency <= 0."""
    problems = plan_problems(plan)
    if problems:
        raise ValueError("the plan: " + "; ".join(problems))
    arms = sorted({name for claim in (*plan.claims, *plan.controls) for name in (claim.arm, claim.baseline)})
    seen: set[str] = set()
    complete: list[tuple[str, dict[str, float], Mapping]] = []
    incomplete: list[str] = []
    for position, block in enumerate(blocks):
        ident = str(block.get("block", position))
        if ident in seen:
            raise ValueError(f"block {ident!r} appears twice")
        seen.add(ident)
        host = block.get("host_kind")
        if not isinstance(host, str) or not host:
            raise ValueError(f"block {ident!r}: host_kind must be a non-empty string, not {host!r}")
        final = block.get("final") or {}
        values: dict[str, float] = {}
        for name in arms:
            value = final.get(name)
            latency = math.nan if value is None else float(value)
            if math.isfinite(latency) and latency <= 0:
                raise ValueError(f"block {ident!r}: latency of {name!r} is {latency!r}, not > 0")
            values[name] = latency
        if all(math.isfinite(v) for v in values.values()):
            complete.append((host, values, block))
        else:
            incomplete.append(ident)
    if plan.looks:
        complete, look, look_alpha = _scheduled_look(plan, complete)
    else:
        look, look_alpha = _look_now(plan, len(complete))
    n = len(complete)
    information = min(1.0, n / plan.planned_blocks)
    withheld = n < plan.min_blocks
    hosts = [host for host, _, _ in complete]
    families = []
    for family, claims in (("claims", plan.claims), ("controls", plan.controls)):
        if withheld:
            counts = tuple(HostKind(kind, hosts.count(kind), None) for kind in sorted(set(hosts)))
            families.append(tuple(Row(claim=c, n=n, hosts=counts, alpha=look_alpha, headline="plain", plain=None,
                                      stratified=None, heterogeneity_p=None, p_adjusted=None, verdict=WITHHELD,
                                      withheld=WITHHELD, family=family) for c in claims))
            continue
        rows = [_row(c, complete, look_alpha) for c in claims]
        adjusted = holm([row.estimate.p for row in rows if row.estimate is not None])
        families.append(tuple(
            dataclasses.replace(row, p_adjusted=p, family=family,
                                verdict=_verdict(row.claim, row.estimate, p, look_alpha))  # type: ignore[arg-type]
            for row, p in zip(rows, adjusted)))
    return Table(plan=plan, claims=families[0], controls=families[1], n_blocks=n, incomplete=tuple(incomplete),
                 information=information, look=look, look_alpha=look_alpha, withheld=withheld)


def _row(claim: Claim, complete: list, alpha: float) -> Row:
    """A claim's row over the look's complete blocks ((host kind, final latencies, the block) each); a
    censored measure's from each block's claim.measure mapping {arm: [value, censored]}, a block
    without both arms' values left out of it."""
    if claim.measure == "final":
        return ratio_row([v[claim.arm] for _, v, _ in complete], [v[claim.baseline] for _, v, _ in complete],
                         [host for host, _, _ in complete], claim, alpha)
    pairs = []
    for host, _, block in complete:
        measured = block.get(claim.measure) or {}
        arm, baseline = _censored_value(measured.get(claim.arm)), _censored_value(measured.get(claim.baseline))
        if arm is not None and baseline is not None:
            pairs.append((arm, baseline, host))
    return censored_row([a for a, _, _ in pairs], [b for _, b, _ in pairs], [h for _, _, h in pairs], claim, alpha)


def _censored_value(value) -> tuple[float, bool] | None:
    """A block's [value, censored] as a pair, None where it is not one."""
    if (isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[0], (int, float))
            and not isinstance(value[0], bool) and isinstance(value[1], bool)):
        return float(value[0]), value[1]
    return None


def _look_now(plan: Plan, n: int) -> tuple[str, float]:
    """With no schedule, every table is a look: final at the planned blocks, else interim at the
    O'Brien-Fleming spending of its information fraction (or "early" at the full alpha without a rule)."""
    if n >= plan.planned_blocks:
        return "final", plan.alpha
    if plan.interim == "obrien_fleming":
        return "interim", obrien_fleming_alpha(plan.alpha, n / plan.planned_blocks)
    return "early", plan.alpha


def _scheduled_look(plan: Plan, complete: list) -> tuple[list, str, float]:
    """The latest look of the declared schedule that the complete blocks reach: its blocks (the first
    n_k, in the order given), its kind ("final", "interim", or "none yet" with no block) and level."""
    reached = [count for count in plan.looks if count <= len(complete)]
    if not reached:
        return [], "none yet", 0.0
    levels = group_sequential_levels(plan.alpha, [count / plan.planned_blocks for count in plan.looks])
    kind = "final" if reached[-1] >= plan.planned_blocks else "interim"
    return complete[: reached[-1]], kind, levels[len(reached) - 1]


# ---- Markdown -----------------------------------------------------------------------------------
def markdown(table: Table) -> str:
    """The table as compact Markdown: a row per claim and control (n blocks, host kinds, the headline
    ratio with its interval or "withheld", Holm p, verdict), then a line stating alpha, the look and the
    family sizes."""
    lines = ["| family | claim | n | host kinds | ratio [CI] | p (Holm) | verdict |",
             "|---|---|---|---|---|---|---|"]
    for row in (*table.claims, *table.controls):
        claim = row.claim
        what = f"{claim.arm} / {claim.baseline}{MEASURE_WORDS[claim.measure]}, " + (
            "difference" if claim.kind == "difference" else f"equivalence ±{_g(claim.margin)}")
        kinds = ", ".join(f"{h.kind} ×{h.n}" + ("" if h.ratio is None else f" {h.ratio:.3f}") for h in row.hosts)
        estimate = row.estimate
        if row.withheld or estimate is None:
            ratio = p = "withheld"
        else:
            ratio = f"{estimate.ratio:.3f} [{estimate.low:.3f}, {estimate.high:.3f}]"
            if row.headline == "stratified":
                ratio += f" stratified (het. p {_p(row.heterogeneity_p)})"
            p = _p(row.p_adjusted)
        lines.append(f"| {row.family} | {what} | {row.n} | {kinds or '-'} | {ratio} | {p} | {row.verdict} |")
    plan = table.plan
    if plan.looks:
        done = sum(count <= table.n_blocks for count in plan.looks) if table.n_blocks else 0
        look = (f"look {done} of the {len(plan.looks)} planned (at {', '.join(map(str, plan.looks))} blocks), "
                f"over the first {table.n_blocks} complete blocks, exact group-sequential level {_g(table.look_alpha)}"
                if done else f"no planned look yet (the first is at {plan.looks[0]} complete blocks)")
    elif table.look == "interim":
        look = (f"interim look at {table.n_blocks} of {plan.planned_blocks} planned blocks (t = "
                f"{table.information:.2f}), O'Brien-Fleming alpha at this look {_g(table.look_alpha)}")
    elif table.look == "early":
        look = (f"early look at {table.n_blocks} of {plan.planned_blocks} planned blocks with no interim rule "
                f"(the full alpha {_g(table.look_alpha)}: no interim spending was planned)")
    else:
        look = f"final look at {table.n_blocks} blocks (planned {plan.planned_blocks}), alpha {_g(table.look_alpha)}"
    tail = [f"alpha {_g(plan.alpha)}; {look}; families (Holm within each): {len(table.claims)} claim(s), "
            f"{len(table.controls)} control(s); intervals at 1 - the look's alpha"]
    if table.withheld and table.look == "none yet":
        tail.append(f"every estimate withheld until the first planned look ({plan.looks[0]} complete blocks)")
    elif table.withheld:
        tail.append(f"every estimate withheld: {table.n_blocks} complete block(s) < min_blocks {plan.min_blocks}")
    if table.incomplete:
        tail.append(f"{len(table.incomplete)} incomplete block(s) left out: {', '.join(table.incomplete)}")
    return "\n".join(lines) + "\n\n" + "\n".join(tail) + "\n"


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _p(value: float | None) -> str:
    if value is None:
        return "-"
    return "<0.0001" if value < 1e-4 else f"{value:.4f}"
