"""A study's adjudication against the winner's curse, on synthetic hardware with fresh noise of known size.

hardware=synthetic with fresh_noise=true gives every reading of a config a fresh draw of its jitter:
each repeat is cost * (1 + a * (2U - 1)), U uniform, and a reading is the median of the evaluator's
`repeat` repeats, so for r = 2k - 1 repeats it is cost * (1 + a * (2M - 1)) with M ~ Beta(k, k). A
random-search arm (cost_model=none) visits configs that do not depend on the noise, so given the
true costs c_i of the configs it read, the reading that selects its best config has an exact
expectation from order statistics:

    E[R_sel / c_sel] = sum_i  integral (x / c_i) f_i(x) prod_{j != i} S_j(x) dx

(f_i the density and S_j the survival function of reading j). Over many (task, seed) blocks this
checks (b) that the naive "best reading / its config's true cost" is biased low by just that much,
and (a) that the block's adjudicated final latency (fresh readings of the finalist) is not.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf
from scipy import stats

from tuning.core.task import build_tasks
from tuning.study.block import arm_config, run_block
from tuning.study.spec import StudySpec, study_spec

NOISE = 0.3
BLOCKS = 30
TRIALS = 32
TASK = "gemm_64"
HOST = {"cpu_model": "test", "cores": 2, "flags": "x"}
WALL_CLOCK = ("started", "wall_s", "machine")  # what differs between runs: the clock and the machine around it


def spec() -> StudySpec:
    return study_spec("winners_curse", OmegaConf.create({
        "description": "the reading that selects a config is biased low; fresh readings are not",
        "common": ["hardware=synthetic", f"hardware.noise={NOISE}", "hardware.fresh_noise=true", "evaluator=fixed"],
        "arms": {"random": ["search=random", "cost_model=none"],
                 "sa": ["search=sa", "sampler=greedy", "cost_model=xgb"]},
        "tasks": [TASK], "seeds": BLOCKS, "budget": {"trials": TRIALS, "plan_size": 8},
        "adjudication": {"top_k": 3, "rereads": 3, "confirm": 5}, "panel": {"configs": 2},
        "analysis": {"claims": [{"arm": "sa", "baseline": "random", "kind": "difference"}]}}))


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Every block's record, and the hardware, task and evaluator the arms were composed with."""
    study = spec()
    work = tmp_path_factory.mktemp("study")
    cfg = arm_config(study, study.arms[0][1], TASK, 0, work / "composed")
    hardware, evaluator = instantiate(cfg.hardware), instantiate(cfg.evaluator)
    [task] = build_tasks(cfg.model)
    blocks = [run_block(study, TASK, seed, work / f"block{seed}", HOST) for seed in study.seeds]
    return study, blocks, hardware, task, evaluator, work


def true_cost(hardware, task, config) -> float:
    """The noise-free latency SyntheticHardware's readings scatter around (its `_measure_one`)."""
    efficiency = hardware.efficiency(hardware.space(task), tuple(config))
    assert efficiency is not None
    return task.flops / (hardware.peak_gflops * 1e9 * efficiency)


def median_cdf(u: np.ndarray, k: int) -> np.ndarray:
    """P(median of 2k - 1 uniforms <= u), i.e. Beta(k, k)'s cdf: at least k of them are <= u."""
    n = 2 * k - 1
    return sum(math.comb(n, j) * u**j * (1 - u) ** (n - j) for j in range(k, n + 1))


def expected_selected_ratio(costs: list[float], noise: float, repeat: int, points: int = 4001) -> float:
    """E[R_sel / c_sel] for readings R_i = c_i * (1 + noise * (2 M_i - 1)), M_i ~ Beta(k, k) independent,
    sel = argmin R_i: sum over i of the integral over u (reading i's M) of (its ratio) * (its density)
    * P(every other reading is larger), by Simpson's rule (the integrand is smooth enough: the Beta
    cdf's first two derivatives vanish at its ends)."""
    assert repeat % 2 == 1, "a reading is the median of an odd number of repeats here"
    k = (repeat + 1) // 2
    c = np.asarray(costs, dtype=np.float64)
    u = np.linspace(0.0, 1.0, points)
    ratio = 1 + noise * (2 * u - 1)
    density = stats.beta.pdf(u, k, k)
    x = c[:, None] * ratio[None, :]  # reading i's value at each u: shape (readings, points)
    # P(reading j > x) for every j and every (i, u): u_j = (x / c_j - 1 + noise) / (2 noise)
    uj = np.clip((x[None, :, :] / c[:, None, None] - 1 + noise) / (2 * noise), 0.0, 1.0)
    survival = 1 - median_cdf(uj, k)  # (j, i, points)
    others = np.ones_like(x)
    for j in range(len(c)):
        mask = np.ones(len(c), dtype=bool)
        mask[j] = False
        others[mask] *= survival[j][mask]
    integrand = (ratio * density)[None, :] * others
    weights = np.ones(points)
    weights[1:-1:2], weights[2:-1:2] = 4, 2
    return float(np.sum(integrand @ weights) * (u[1] - u[0]) / 3)


def t_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    v = np.asarray(values, dtype=np.float64)
    mean, se = float(v.mean()), float(v.std(ddof=1) / math.sqrt(len(v)))
    half = float(stats.t.ppf(0.5 + confidence / 2, len(v) - 1)) * se
    return mean, mean - half, mean + half


def test_the_theory_by_simulation():
    """The order-statistics expectation agrees with brute-force sampling of the same readings."""
    rng = np.random.default_rng(0)
    costs = list(rng.uniform(1.0, 1.4, size=12))
    k, draws = 3, 200_000
    medians = rng.beta(k, k, size=(draws, len(costs)))
    readings = np.asarray(costs) * (1 + NOISE * (2 * medians - 1))
    chosen = readings.argmin(axis=1)
    simulated = readings[np.arange(draws), chosen] / np.asarray(costs)[chosen]
    theory = expected_selected_ratio(costs, NOISE, 2 * k - 1)
    assert abs(simulated.mean() - theory) < 4 * simulated.std() / math.sqrt(draws), (simulated.mean(), theory)
    assert expected_selected_ratio([1.0], NOISE, 5) == pytest.approx(1.0, abs=1e-9)


def test_selecting_reading_is_biased_low_as_order_statistics_predict(study):
    """(b) best reading / its config's true cost, block by block, against its exact expectation."""
    _, blocks, hardware, task, evaluator, _ = study
    repeat = evaluator.spec.repeat
    observed, theory = [], []
    for block in blocks:
        records = block["arms"]["random"]["records"]
        ok = [(config, cost) for config, cost, error in records if error is None]
        assert all(error.startswith("invalid") for _, cost, error in records if error is not None), records
        assert len(ok) >= TRIALS // 2
        costs = [true_cost(hardware, task, config) for config, _ in ok]
        best = min(range(len(ok)), key=lambda i: ok[i][1])
        observed.append(ok[best][1] / costs[best])
        theory.append(expected_selected_ratio(costs, hardware.noise, repeat))
    mean, low, high = t_interval(observed)
    expected = float(np.mean(theory))
    assert expected < 0.95, f"the test cannot fail: theory's mean ratio {expected:.4f} shows little bias"
    assert high < 1.0, f"selecting reading / true cost: mean {mean:.4f} [{low:.4f}, {high:.4f}] is not biased low"
    # agreement with theory at 99%: these 30 seeds sit near the edge of the 95% interval (150 other seeds
    # read 0.929 against 0.920 predicted), and a change to how random search draws gives new samples
    mean, low, high = t_interval(observed, 0.99)
    difference = t_interval([o - t for o, t in zip(observed, theory)], 0.99)
    assert low <= expected <= high, (f"selecting reading / true cost: mean {mean:.4f} [{low:.4f}, {high:.4f}], "
                                     f"order statistics predict {expected:.4f}")
    assert difference[1] <= 0.0 <= difference[2], f"observed - predicted, block by block: {difference}"


def test_adjudicated_final_latency_is_unbiased(study):
    """(a) final_s (fresh readings of the finalist) / the finalist's true cost has mean 1."""
    _, blocks, hardware, task, _, _ = study
    ratios = []
    for block in blocks:
        arm = block["arms"]["random"]
        assert arm["final_s"] is not None and arm["finalist"] is not None
        ratios.append(arm["final_s"] / true_cost(hardware, task, arm["finalist"]))
    mean, low, high = t_interval(ratios)
    assert low <= 1.0 <= high, f"final latency / true cost: mean {mean:.4f} [{low:.4f}, {high:.4f}] does not cover 1"


def test_same_seed_same_block(study):
    """Fresh noise is still deterministic given the order of measurements: a block run again is the same."""
    spec_, blocks, _, _, _, work = study
    again = run_block(spec_, TASK, spec_.seeds[0], work / "again", HOST)
    def timeless(block):  # an arm's tuning seconds (in all, by round, to the target) are wall clock
        arms = {name: {**{k: v for k, v in arm.items() if k not in ("tuning_s", "to_target_s", "rounds")},
                       "rounds": [count for count, _ in arm["rounds"]]} for name, arm in block["arms"].items()}
        return {**{k: v for k, v in block.items() if k not in WALL_CLOCK}, "arms": arms}
    assert timeless(again) == timeless(blocks[0])
    # ...and the noise was fresh: re-reads of one config differ
    rereads = [values for values in blocks[0]["arms"]["random"]["rereads"].values() if len(values) > 1]
    assert rereads and all(len(set(values)) == len(values) for values in rereads)


def test_fresh_noise_is_in_the_fingerprint(study):
    _, _, hardware, _, _, _ = study
    assert hardware.fingerprint()["fresh_noise"] is True
    assert "fresh_noise" not in type(hardware)(noise=NOISE).fingerprint()  # the default's stores stay valid
