"""Chameleon's two pieces on hand-made data: the k-means knee, sample synthesis, the published code's
sampler (sampler=kmeans_code), the PPO agent; and the rows of conf/experiment/chameleon_row/."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from test_loop import finish, run_py
from tuning.core.measure import MeasureSpec
from tuning.core.space import Knob, Space
from tuning.core.task import conv2d_task
from tuning.hardware.synthetic import SyntheticHardware
from tuning.sampler.kmeans import KMeansSampler, per_knob_mode, snap
from tuning.search.actor_critic import generalized_advantages
from tuning.search.ppo import PPO


def grid_space(*sizes: int, sketches: int = 1) -> Space:
    """Categorical knobs with `sizes` choices each, all active in every sketch."""
    knobs = [Knob("sketch", "sketch", tuple(range(sketches)))]
    knobs += [Knob(f"k{i}", "categorical", tuple(range(size))) for i, size in enumerate(sizes)]
    return Space(knobs, [tuple(range(1, len(knobs)))] * sketches)


# ---- the knee rule ------------------------------------------------------------------------
def scripted_losses(sampler: KMeansSampler, losses: dict) -> list[int]:
    """Make k-means report `losses[k]`; returns the k values it was run for."""
    tried = []

    def fake_kmeans(points, k, rng):
        tried.append(k)
        return k, np.arange(len(points)) % k, np.zeros((k, points.shape[1])), losses[k]

    sampler._kmeans = fake_kmeans
    return tried


@pytest.mark.parametrize("losses,step,expected", [
    # 2.5 * 30 <= 100 and 2.5 * 10 <= 30 go on; 2.5 * 9 > 10 breaks: Algorithm 1 keeps that k's centroids
    ({8: 100.0, 9: 30.0, 10: 10.0, 11: 9.0}, 1, 11),
    ({8: 100.0, 9: 50.0}, 1, 9),  # the first step already falls by less than 2.5x
    ({8: 100.0, 16: 30.0, 24: 20.0}, 8, 24),  # the published code's k = 8, 16, ...
    ({k: 100.0 / 3.0 ** (k - 8) for k in range(8, 12)}, 1, 11),  # never breaks: the last k of the range
])
def test_knee_rule_picks_the_k_algorithm_1_says(losses, step, expected):
    sampler = KMeansSampler(k_step=step, k_max=max(losses) + 1)
    tried = scripted_losses(sampler, losses)
    k, _, _ = sampler.knee(np.random.default_rng(0).random((64, 3)), np.random.default_rng(0))
    assert k == expected
    assert tried == [k for k in sorted(losses) if k <= expected]


def test_knee_on_real_kmeans_stops_after_the_true_number_of_groups():
    """Ten tight groups on a line, gaps 1, 2, 4, ...: merging groups costs 3 * gap^2, so
    k = 8 -> 9 -> 10 each cut the loss by more than 2.5x and 11 barely does."""
    rng = np.random.default_rng(0)
    centres = np.concatenate([[0.0], np.cumsum(2.0 ** np.arange(9))])
    points = np.concatenate([c + rng.normal(0, 1e-3, (6, 1)) for c in centres])
    k, labels, _ = KMeansSampler().knee(points, np.random.default_rng(1))
    assert k == 11
    assert len(set(labels)) == 11


def test_fewer_distinct_candidates_than_k_min_are_each_their_own_sample():
    space = grid_space(6, 6)
    candidates = [(0, 1, 2), (0, 3, 4), (0, 5, 0), (0, 1, 2)]
    chosen = KMeansSampler().select(candidates, space, set(), 64, np.random.default_rng(0))
    assert sorted(chosen) == sorted(set(candidates))


# ---- centroids and synthesis -------------------------------------------------------------
def test_snap_is_the_nearest_valid_config():
    knobs = [Knob("sketch", "sketch", (0, 1)), Knob("a", "categorical", tuple(range(5))),
             Knob("b", "categorical", tuple(range(3)))]
    space = Space(knobs, [(1, 2), (1,)])  # sketch 1 has no knob b
    assert snap(space, np.array([0.1, 0.49, 0.8])) == (0, 2, 2)
    assert snap(space, np.array([0.9, 0.26, 0.0])) == (1, 1, 0)
    assert snap(space, np.array([0.6, 1.0, 0.1])) == (1, 4, 0)  # b near 0: sketch 1 is nearer


def test_per_knob_mode():
    space = grid_space(5, 5, 5)
    pool = [(0, 1, 2, 0), (0, 1, 3, 4), (0, 2, 3, 4), (0, 1, 0, 4), (0, 4, 3, 1)]
    assert per_knob_mode(space, pool) == (0, 1, 3, 4)


def test_visited_centroids_become_the_mode_then_never_a_visited_config():
    """Every candidate is visited, so every centroid is: the first becomes the per-knob mode
    (itself never measured), the others are synthesised from the candidates' values."""
    space = grid_space(5, 5, 5)
    pool = [(0, 1, 2, 0), (0, 1, 3, 2), (0, 2, 3, 4), (0, 1, 0, 4), (0, 4, 3, 1),
            (0, 1, 3, 0), (0, 0, 3, 3), (0, 3, 1, 4)]
    assert (0, 1, 3, 4) not in pool
    visited = set(pool)
    sampler = KMeansSampler()
    chosen = sampler.select(pool, space, visited, 64, np.random.default_rng(0))
    assert chosen[0] == (0, 1, 3, 4)
    assert len(chosen) == 8 and len(set(chosen)) == 8
    assert not set(chosen) & visited
    assert sampler.metrics() == {"k": 8, "synthesised": 8, "random": 0}
    values = [{c[i] for c in pool} for i in range(4)]
    assert all(all(c[i] in values[i] for i in range(4)) for c in chosen)  # built from the pool's values


def test_synthesis_from_the_cluster_when_asked():
    """Two groups, all visited; synthesis_pool=cluster builds each replacement from its own
    group's values (the ReLeASE code): the one unvisited combination of each group."""
    space = grid_space(4, 4)
    group_a, group_b = [(0, 0, 0), (0, 0, 1), (0, 1, 0)], [(0, 3, 3), (0, 3, 2), (0, 2, 3)]
    visited = set(group_a + group_b)
    sampler = KMeansSampler(k_min=2, k_max=3, synthesis_pool="cluster")
    chosen = sampler.select(group_a + group_b, space, visited, 64, np.random.default_rng(0))
    assert sorted(chosen) == [(0, 1, 1), (0, 2, 2)]


def test_kmeans_measures_fewer_than_greedy_on_search_candidates():
    """On 64 spread-out candidates the knee stops far below 64: the batch adapts."""
    space = grid_space(8, 8, 8, 8)
    rng = np.random.default_rng(0)
    candidates = [space.sample(rng) for _ in range(64)]
    sampler = KMeansSampler()
    chosen = sampler.select(candidates, space, set(), 64, np.random.default_rng(0))
    assert 8 <= len(chosen) == sampler.metrics()["k"] < 64


# ---- sampler=kmeans_code ---------------------------------------------------------------------------
def kmeans_code(**overrides) -> KMeansSampler:
    return KMeansSampler(**{"k_min": 8, "k_max": 65, "k_step": 8, "cluster_dims": 2, "synthesis_pool": "cluster",
                            "keep_k_min": True, "random_share": 0.05, **overrides})


def few_distinct_candidates():
    """40 candidates whose two largest knobs take only 3 distinct pairs (the case where k fell to 3)."""
    space = grid_space(2, 3, 40, 50)
    pairs = [(5, 7), (20, 30), (39, 49)]
    rng = np.random.default_rng(1)
    candidates = [(0, int(rng.integers(2)), int(rng.integers(3)), *pairs[i % 3]) for i in range(40)]
    return space, candidates


def test_kmeans_code_keeps_k_at_least_8_and_adds_its_random_picks():
    space, candidates = few_distinct_candidates()
    sampler = kmeans_code()
    chosen = sampler.select(candidates, space, set(), 64, np.random.default_rng(0))
    assert sampler.last_k >= 8 and len(chosen) == sampler.last_k
    assert sampler.metrics()["random"] == int(0.05 * 64) == 3
    assert len(set(chosen)) == len(chosen)
    outside = [c for c in chosen[-3:] if (c[3], c[4]) not in {(5, 7), (20, 30), (39, 49)}]
    assert outside, "the last picks are random configs, not the candidates' clusters"
    assert sampler.metrics()["synthesised"] >= sampler.last_k - 3 - 3  # duplicate centres are synthesised


def test_the_papers_kmeans_still_shrinks_k_and_adds_no_random_picks():
    space, candidates = few_distinct_candidates()
    sampler = KMeansSampler(cluster_dims=2)
    sampler.select(candidates, space, set(), 64, np.random.default_rng(0))
    assert sampler.last_k == 3 and sampler.metrics()["random"] == 0


def test_random_share_is_a_share_of_the_plan_not_of_k():
    space = grid_space(6, 6, 6)
    rng = np.random.default_rng(2)
    candidates = [space.canonical(space.sample(rng)) for _ in range(100)]
    sampler = kmeans_code(random_share=0.25, keep_k_min=False)
    chosen = sampler.select(candidates, space, set(), 16, np.random.default_rng(0))
    assert sampler.metrics()["random"] == 4 and len(chosen) == min(sampler.last_k, 16)


# ---- the PPO agent -----------------------------------------------------------------------
class Landscape:
    """A fixed cost model: the score peaks at one config (features are the knob values)."""

    def __init__(self, space, peak):
        self.target = space.features([peak])[0]

    def predict(self, X):
        return -((np.asarray(X) - self.target) ** 2).sum(axis=1)


def test_ppo_update_improves_the_surrogate_reward():
    """Random starts every round (nothing observed): only the learned policy can raise the
    walks' mean predicted score."""
    space = grid_space(12, 12, 12, 12, 12, 12)
    model = Landscape(space, (0, 9, 2, 11, 5, 7, 3))
    ppo, rng = PPO(episodes=64, max_steps=40), np.random.default_rng(0)
    means = []
    for _ in range(12):
        ppo.propose(space, model, 16, set(), rng)
        means.append(ppo.metrics()["mean_score"])
    assert np.mean(means[-3:]) > np.mean(means[:3]) + 0.25 * abs(np.mean(means[:3]))


def test_ppo_same_seed_same_trajectory_and_proposals():
    space = grid_space(7, 7, 7, sketches=2)
    model = Landscape(space, (1, 2, 5, 3))
    runs = []
    for _ in range(2):
        ppo, rng = PPO(episodes=32, max_steps=30), np.random.default_rng(5)
        runs.append([(ppo.propose(space, model, 8, set(), rng), ppo.metrics()) for _ in range(3)])
    assert runs[0] == runs[1]


PPO_DIAGNOSTICS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "explained_variance")


def test_ppo_logs_learning_diagnostics_per_update():
    space = grid_space(12, 12, 12, 12)
    model = Landscape(space, (0, 9, 2, 11, 5))
    ppo, rng = PPO(episodes=32, max_steps=30), np.random.default_rng(0)
    for _ in range(3):
        ppo.propose(space, model, 8, set(), rng)
        metrics = ppo.metrics()
        assert set(PPO_DIAGNOSTICS) <= set(metrics) and all(np.isfinite(metrics[k]) for k in PPO_DIAGNOSTICS)
        assert 0 < metrics["entropy"] <= len(space.knobs) * np.log(3) + 1e-6  # three moves per knob
        assert metrics["approx_kl"] >= 0 and 0 <= metrics["clipfrac"] <= 1 and metrics["value_loss"] >= 0


def test_ppo_diagnostics_measure_how_far_the_policy_moved():
    space = grid_space(12, 12, 12, 12)
    model = Landscape(space, (0, 9, 2, 11, 5))
    # one minibatch, one epoch: the only step is taken at the sampling policy, so ratio == 1
    still = PPO(episodes=16, max_steps=10, early_stop=10, epochs=1, minibatch_size=10_000)
    still.propose(space, model, 8, set(), np.random.default_rng(0))
    assert still.metrics()["approx_kl"] == pytest.approx(0, abs=1e-7) and still.metrics()["clipfrac"] == 0
    # many steps with a big learning rate and a tiny clip: the policy moves, most ratios leave 1 +- clip
    moving = PPO(episodes=16, max_steps=10, early_stop=10, epochs=8, minibatch_size=16, learning_rate=0.05, clip=1e-6)
    moving.propose(space, model, 8, set(), np.random.default_rng(0))
    assert moving.metrics()["approx_kl"] > 1e-6 and moving.metrics()["clipfrac"] > 0.5


def test_ppo_starts_from_the_best_measured_configs():
    hardware = SyntheticHardware()
    task = conv2d_task("c", 1, 16, 14, 14, 32, 3, 1, 1)
    space = hardware.space(task)
    rng = np.random.default_rng(0)
    configs = [space.canonical(space.sample(rng)) for _ in range(40)]
    results = hardware.measure(task, configs, MeasureSpec())
    ppo = PPO(best_starts=4)
    ppo.observe(configs, results)
    fastest = sorted((r.cost, c) for c, r in zip(configs, results))[:4]
    assert [tuple(c) for _, c in ppo.best] == [c for _, c in fastest]
    starts = ppo._start_configs(space, rng)
    assert [tuple(row) for row in starts[:4]] == [c for _, c in fastest] and len(starts) == ppo.episodes


def test_gae_cuts_at_an_episode_end_and_bootstraps_a_cut_walk():
    reward = np.array([[1.0, 1.0], [1.0, 1.0]])
    value = np.zeros((2, 2))
    ends = np.array([[False, True], [False, False]])  # walker 1 ended at step 0; walker 0 was cut
    advantage = generalized_advantages(reward, value, ends, np.array([10.0, 99.0]), gamma=0.5, lam=1.0)
    assert advantage[:, 0].tolist() == [1 + 0.5 * (1 + 0.5 * 10), 1 + 0.5 * 10]
    assert advantage[0, 1] == 1.0  # nothing after its end leaks back


# ---- the rows of conf/experiment/chameleon_row/ compose, validate and run ---------------------------
CHAMELEON_ROWS = ("ae_cold", "ae_as_cold", "sa_plan_k", "sa_as_code", "ae_as_code")


@pytest.mark.parametrize("row", CHAMELEON_ROWS)
def test_each_chameleon_row_composes_and_validates(compose_cfg, row):
    from tuning.engine.validate import validate

    cfg = compose_cfg(f"+experiment/chameleon_row={row}")
    validate(cfg)
    if row.endswith("_cold"):
        assert cfg.search.best_starts == 0
    if row.endswith("_code"):
        assert cfg.sampler.keep_k_min and cfg.sampler.random_share == 0.05


def test_the_chameleon_rows_run_on_synthetic_hardware(tmp_path):
    """Every control and fidelity row, one run each, in one sweep on the synthetic hardware."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    finish(run_py("-m", "model=gemm_64", "hardware=synthetic", "hardware.noise=0.1", f"tracking.uri={uri}",
                  "budget.trials=16", "budget.plan_size=8", f"+experiment/chameleon_row={','.join(CHAMELEON_ROWS)}",
                  f"hydra.sweep.dir={tmp_path}/c", tmp=tmp_path), timeout=600)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("tunelab").experiment_id],
                              "attributes.status = 'FINISHED'")
    rows = {r.data.tags.get("choice.experiment/chameleon_row") for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert rows == set(CHAMELEON_ROWS)
    code_runs = [r for r in runs if r.data.tags.get("choice.experiment/chameleon_row", "").endswith("_code")]
    for run in code_runs:
        ks = [m.value for m in client.get_metric_history(run.info.run_id, "sampler/k")]
        assert ks and min(ks) >= 8, ks


# ---- the ablation table (a preset of tuning.tools.compare) -----------------------------------------
def test_table_names_the_papers_columns_and_compares_with_sa(experiment_script):
    from tuning.tools.compare import Curve, TaskTruth, compare
    from tuning.tools.compare.ablation import preset_argv

    table = experiment_script("chameleon_table")
    argv = preset_argv(argparse.Namespace(
        mlflow_experiment="tunelab", fraction=0.95, uri="sqlite:///x.db", parent=["p1"], budgets=None), "chameleon_x", table.ARGS)
    assert argv[argv.index("--baseline") + 1] == "SA" and argv[argv.index("--method-by") + 1] == "search,sampler"
    assert ["--tag", "experiment=chameleon_x"] == argv[2:4] and ["--parent", "p1"] == argv[-2:]
    assert [table.COLUMNS[m] for m in ("sa+greedy", "ppo+greedy", "sa+kmeans", "ppo+kmeans")] == list(
        table.PAPER_COLUMNS)
    curves = [Curve("conv_l8", table.COLUMNS[m], s, f"{m}{s}", np.array([200e-6, 100e-6 * f]), np.array([1.0, 2.0]),
                    "readings") for m, f in (("sa+greedy", 1.0), ("ppo+kmeans", 0.9)) for s in range(6)]
    result = compare(curves, {"conv_l8": TaskTruth({}, 90e-6, "readings")}, "SA", budgets=(2,), fraction=0.95)
    [row] = [r for r in result.budget_table if r["method"] == "AE+AS"]
    assert row["ratio"] == pytest.approx(0.9) and row["verdict"] == "better"
    assert any("1.98x fewer measurements with SA" in line for line in table.paper_lines())


@pytest.mark.parametrize("count,size", [(70, 32), (64, 32), (5, 32), (7, 1), (33, 32)])
def test_advantages_are_standardised_per_minibatch_as_one_at_a_time_would(count, size):
    from tuning.search.ppo import _normalised_per_minibatch

    advantage = np.random.default_rng(count).normal(size=count)
    expected = []
    for start in range(0, count, size):
        part = advantage[start:start + size]
        expected.append((part - part.mean()) / (part.std(ddof=1) + 1e-8) if len(part) > 1 else part)
    assert np.array_equal(_normalised_per_minibatch(advantage, size), np.concatenate(expected))
