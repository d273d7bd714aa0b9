"""The GEMM-tiling paper's methods (Zhang et al. 2019): its space, its moves, G-BFS and N-A2C, and the
rows of conf/experiment/gemm_tiling_row/ that each change one of its settings.

On hardware=synthetic (the tiling space built as hardware=cpu builds it); the real space and a real
tiled kernel are in the `tvm`-marked tests at the end."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from omegaconf import OmegaConf

from test_loop import outcome_keys, tune
from tuning.config.conf_dir import CONF_DIR
from tuning.core.measure import MeasureSpec
from tuning.core.records import MeasureResult
from tuning.core.task import gemm_task
from tuning.hardware.synthetic import SyntheticHardware, synthetic_space
from tuning.search.a2c import NeighbourhoodA2C, applicable
from tuning.search.gbfs import GreedyBestFirst

HARDWARE = SyntheticHardware()
TILING_64 = gemm_task("gemm_64", 64, 64, 64, space="tiling")
PAPER_MOVES = ("factor", "nontile_index")


def tiling_space(m, n=None, k=None):
    return HARDWARE.space(gemm_task("g", m, n or m, k or m, space="tiling"))


def splits(space, config) -> list[tuple]:
    return [space.knobs[i].choices[config[i]] for i in space.active_slots(config) if space.knobs[i].kind == "tile"]


def measure(space, task, configs):
    return HARDWARE.measure(task, configs, MeasureSpec())


# ---- the space -----------------------------------------------------------------------------
@pytest.mark.parametrize("size,expected", [(512, 484_000), (1024, 899_756), (2048, 1_589_952)])
def test_tiling_space_has_the_papers_size(size, expected):
    space = tiling_space(size)
    assert space.size == expected  # §5: "the total numbers of configuration candidates"
    assert [len(s) for s in splits(space, space.untiled())] == [4, 4, 2]  # d_m = d_n = 4, d_k = 2


def test_untiled_start_is_the_papers_s0():
    space = tiling_space(1024)
    assert splits(space, space.untiled()) == [(1024, 1, 1, 1), (1024, 1, 1, 1), (1024, 1)]


def test_a_tiling_task_is_another_task_than_the_metaschedule_one():
    assert TILING_64.key != gemm_task("gemm_64", 64, 64, 64).key


def paper_neighbours(space, config) -> set:
    """Eq. 6 by hand: within one axis, s[i] <- 2 s[i] and s[j] <- s[j] / 2, i != j."""
    out = set()
    tile_slots = [i for i in space.active_slots(config) if space.knobs[i].kind == "tile"]
    for slot in tile_slots:
        split = space.knobs[slot].choices[config[slot]]
        for i in range(len(split)):
            for j in range(len(split)):
                if i != j and split[j] % 2 == 0:
                    moved = list(split)
                    moved[i], moved[j] = moved[i] * 2, moved[j] // 2
                    out.add(config[:slot] + (space.knobs[slot].choices.index(tuple(moved)),) + config[slot + 1:])
    return out


def test_neighbours_of_a_power_of_two_tiling_are_exactly_eq_6():
    space, rng = tiling_space(64), np.random.default_rng(0)
    for config in [space.untiled()] + [space.sample(rng) for _ in range(50)]:
        neighbours = space.neighbors(config, PAPER_MOVES)
        assert set(neighbours) == paper_neighbours(space, config) and len(set(neighbours)) == len(neighbours)
        assert all(space.is_legitimate(c) for c in neighbours)


def test_neighbours_of_other_extents_move_one_prime_factor():
    space, rng = tiling_space(24, 18, 12), np.random.default_rng(1)
    for config in [space.sample(rng) for _ in range(50)]:
        for moved in space.neighbors(config, PAPER_MOVES):
            changed = [(a, b) for a, b in zip(splits(space, config), splits(space, moved)) if a != b]
            assert len(changed) == 1
            before, after = changed[0]
            assert math.prod(before) == math.prod(after)
            ratios = sorted(max(a, b) // min(a, b) for a, b in zip(before, after) if a != b)
            assert len(ratios) == 2 and ratios[0] == ratios[1] and ratios[0] in (2, 3)


def test_actions_reach_exactly_the_neighbours():
    for space in (tiling_space(64), tiling_space(24, 18, 12), HARDWARE.space(gemm_task("g", 64, 64, 64))):
        rng = np.random.default_rng(2)
        for config in [space.sample(rng) for _ in range(30)]:
            stepped = {space.step(config, a) for a in space.actions()} - {None}
            assert stepped == set(space.neighbors(config, PAPER_MOVES))


def test_nontile_moves_change_one_other_knob_by_one():
    space = HARDWARE.space(gemm_task("g", 64, 64, 64))  # three sketches and an unroll knob
    config = (1, 5, 5, 3, 2)
    others = [c for c in space.neighbors(config, ("nontile_index",))]
    assert others and all(sum(a != b for a, b in zip(config, c)) >= 1 for c in others)
    assert all(space.knobs[i].kind != "tile" for c in others for i, (a, b) in enumerate(zip(config, c)) if a != b)


def test_legitimacy_hook_is_asked_once_per_config():
    space = synthetic_space(TILING_64.workload)  # its own, not the shared hardware's
    asked = []
    space.legitimacy = lambda config: asked.append(config) or config[1] % 2 == 0
    config = space.untiled()
    assert space.is_legitimate(config) == (config[1] % 2 == 0) and space.is_legitimate(config) == space.is_legitimate(config)
    assert asked == [config]


# ---- G-BFS ---------------------------------------------------------------------------------
def test_gbfs_starts_untiled_pops_the_cheapest_and_never_remeasures():
    space, search, rng = tiling_space(64), GreedyBestFirst(), np.random.default_rng(0)
    visited: set = set()
    first = search.propose(space, None, 5, visited, rng)
    assert first == [space.untiled()]
    search.observe(first, measure(space, TILING_64, first))
    visited |= set(first)
    for _ in range(40):
        expected = min(search.queue)[2]  # the cheapest measured state waiting in Q
        proposals = search.propose(space, None, 5, set(visited), rng)
        assert proposals and set(proposals) <= set(space.neighbors(expected, PAPER_MOVES))
        assert not set(proposals) & visited and len(set(proposals)) == len(proposals) <= 5
        assert expected not in [config for _, _, config in search.queue]  # popped
        results = measure(space, TILING_64, proposals)
        search.observe(proposals, results)
        visited |= set(proposals)


def test_gbfs_drops_failed_states_and_stops_when_the_queue_is_empty():
    space, search, rng = tiling_space(4, 2, 2), GreedyBestFirst(rho=100), np.random.default_rng(0)
    visited: set = set()
    task = gemm_task("g", 4, 2, 2, space="tiling")
    for _ in range(1000):
        proposals = search.propose(space, None, 100, set(visited), rng)
        if not proposals:
            break
        results = measure(space, task, proposals)
        results[0] = results[0].failed("invalid", "test", config=proposals[0])
        search.observe(proposals, results)
        visited |= set(proposals)
    assert not proposals and not search.queue
    assert len(visited) <= space.size


def test_gbfs_expands_a_timed_out_start_and_queues_timeouts_after_faster_states():
    """gemm_2048's untiled s0 runs 27 s once and times out (timeout_s 10): a slow legitimate kernel,
    so Algorithm 1 still expands it; a timeout is queued by its probe run's seconds, a failure not."""
    space, search, rng = tiling_space(64), GreedyBestFirst(), np.random.default_rng(0)
    first = search.propose(space, None, 5, set(), rng)
    search.observe(first, [MeasureResult.failed("timeout", "one run took 27.3 s", run_s=27.3, config=first[0])])
    assert search.queue == [(27.3, 0, first[0])]
    second = search.propose(space, None, 5, set(first), rng)
    assert len(second) == 5 and set(second) <= set(space.neighbors(first[0], PAPER_MOVES))
    results = measure(space, TILING_64, second)
    results[1] = MeasureResult.failed("timeout", "one run took 12 s", run_s=12.0, config=second[1])
    results[2] = MeasureResult.failed("build", "test", config=second[2])
    search.observe(second, results)
    assert len(search.queue) == 4 and second[2] not in [config for _, _, config in search.queue]
    assert [config for _, _, config in sorted(search.queue)][-1] == second[1]  # 12 s: after every measured one
    restored = GreedyBestFirst()
    restored.load_state_dict(json.loads(json.dumps(search.state_dict())))
    assert sorted(restored.queue) == sorted(search.queue)


def test_gbfs_plan_larger_than_rho_pops_several_states():
    space, search, rng = tiling_space(64), GreedyBestFirst(rho=2), np.random.default_rng(0)
    first = search.propose(space, None, 6, set(), rng)
    search.observe(first, measure(space, TILING_64, first))
    second = search.propose(space, None, 6, set(first), rng)
    search.observe(second, measure(space, TILING_64, second))
    third = search.propose(space, None, 6, set(first + second), rng)
    assert len(second) == 2 and len(third) == 4 and search.metrics()["pops"] == 2  # Q held two states
    search.observe(third, measure(space, TILING_64, third))
    fourth = search.propose(space, None, 6, set(first + second + third), rng)
    assert len(fourth) == 6 and search.metrics()["pops"] == 3


def test_gbfs_after_shared_random_configs_starts_from_them_not_from_s0(tmp_path):
    """budget.init_random: the run's first 16 measurements are the seed's shared random configs; G-BFS
    then pops the best of them and never measures the untiled s0."""
    from test_loop import components
    from tuning.engine.loop import RunInfo, tune_task

    parts = components(search="gbfs", sampler="all", cost_model="none")
    run = RunInfo(seed=0, out_dir=tmp_path, method="test", trials=26, plan_size=5, init_random=16)
    records = tune_task(TILING_64, parts, run).records
    space = HARDWARE.space(TILING_64)
    shared = [tuple(r.config) for r in records[:16]]
    assert [r.round for r in records[:20]] == [0] * 5 + [1] * 5 + [2] * 5 + [3] * 5  # the 16th shares round 3
    best = min(records[:15], key=lambda r: r.result.cost)  # what G-BFS had measured when round 3 was planned
    assert space.untiled() not in {tuple(r.config) for r in records}
    assert set(tuple(r.config) for r in records[16:20]) <= set(space.neighbors(tuple(best.config), PAPER_MOVES))
    assert not set(shared) & {tuple(r.config) for r in records[16:]}


# ---- N-A2C ---------------------------------------------------------------------------------
def test_a2c_update_on_a_hand_made_transition_moves_actor_and_critic():
    space, rng = tiling_space(64), np.random.default_rng(0)
    search = NeighbourhoodA2C(learning_rate=1e-2, entropy_coef=0.0)
    search._ensure_agent(space, rng)
    state = space.untiled()
    action = int(np.flatnonzero(applicable(space, state))[0])
    following = space.step(state, space.actions()[action])
    inputs = space.unit_features([state])
    mask = applicable(space, state)[None, None, :]

    def policy_and_value():
        now, after = search.agent(inputs, 1.0, mask), search.agent(space.unit_features([following]))
        return float(now.probs[0, 0, action]), float(now.value[0]), float(after.value[0])

    p0, v0, next0 = policy_and_value()
    target = 1.0 + search.gamma * next0
    assert target - v0 > 0  # a rewarded move: positive advantage
    losses = search.update(space, [state], [action], [1.0], [following])
    p1, v1, _ = policy_and_value()
    assert p1 > p0, "the actor must make the rewarded move more likely"
    assert abs(v1 - target) < abs(v0 - target), "the critic must move toward r + gamma V(s')"
    assert set(losses) == {"policy_loss", "value_loss", "entropy"}

    p_before, _, _ = policy_and_value()
    search.update(space, [state], [action], [-5.0], [following])  # a punished move
    assert policy_and_value()[0] < p_before


def test_a2c_walks_from_the_best_state_within_t_steps():
    space, rng = tiling_space(64), np.random.default_rng(3)
    search = NeighbourhoodA2C(walk_steps=2)
    visited: set = set()
    for _ in range(6):
        proposals = search.propose(space, None, 6, set(visited), rng)
        assert len(proposals) == 6 and not set(proposals) & visited
        center = tuple(search.center) if search.center else space.untiled()
        within = {center}
        for _ in range(2):
            within |= {n for c in within for n in space.neighbors(c, PAPER_MOVES)}
        assert set(proposals) <= within
        results = measure(space, TILING_64, proposals)
        search.observe(proposals, results)
        visited |= set(proposals)
        best = min((r.cost, c) for c, r in zip(proposals, results) if r.ok)
        assert search.best_cost <= best[0]
    assert search.memory and all(0 <= a < len(space.actions()) for _, a, _, _ in search.memory)
    assert search.metrics()["walks"] >= 1 and "value_loss" in search.metrics()


def test_a2c_memory_is_bounded():
    space, rng = tiling_space(64), np.random.default_rng(4)
    search, visited = NeighbourhoodA2C(memory_size=10), set()
    for _ in range(5):
        proposals = search.propose(space, None, 6, set(visited), rng)
        search.observe(proposals, measure(space, TILING_64, proposals))
        visited |= set(proposals)
    assert len(search.memory) == 10
    json.dumps(search.state_dict())


# ---- the rows of conf/experiment/gemm_tiling_row/: one factor each -----------------------------
# what each sensitivity row may change from its default row (gbfs or a2c), nothing else
CHANGES = {"gbfs_random_start": {"search.start"}, "gbfs_shared_start": {"budget.init_random"},
           "a2c_shared_start": {"budget.init_random"}, "a2c_epsilon_printed": {"search.epsilon"},
           "gbfs_rho2": {"search.rho", "search.default_plan_size"},
           "gbfs_rho10": {"search.rho", "search.default_plan_size"},
           "a2c_t1": {"search.walk_steps"}, "a2c_t6": {"search.walk_steps"}}


def flat(cfg) -> dict:
    """A job config as {dotted key: value}, Hydra's own node left out."""
    container = OmegaConf.to_container(cfg, resolve=False)
    container.pop("hydra", None)
    found = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            found[prefix[:-1]] = node

    walk(container, "")
    return found


def test_the_sensitivity_rows_are_every_row_but_the_papers_four():
    rows = {path.stem for path in (CONF_DIR / "experiment" / "gemm_tiling_row").glob("*.yaml")}
    assert rows == set(CHANGES) | {"gbfs", "a2c", "xgb", "random"}


@pytest.mark.parametrize("model", ["gemm_1024", "gemm_512"])
@pytest.mark.parametrize("row", sorted(CHANGES))
def test_every_sensitivity_row_changes_one_factor_from_the_papers_settings(compose_cfg, tmp_path, row, model):
    from tuning.engine.validate import validate

    def job(name):
        return compose_cfg("+experiment=gemm_tiling", f"+experiment/gemm_tiling_row={name}", f"model={model}",
                           "seed=0", f"hardware.store={tmp_path / 's.sqlite'}")

    variant, default = job(row), job(row.split("_")[0])
    validate(variant)
    a, b = flat(variant), flat(default)
    assert {key for key in a.keys() | b.keys() if a.get(key) != b.get(key)} == CHANGES[row]


# ---- through the loop: determinism and resume ------------------------------------------------
@pytest.mark.parametrize("search", ["gbfs", "a2c"])
def test_same_seed_same_records(tmp_path, search):
    runs = [tune(tmp_path / str(i), TILING_64, trials=60, search=search, sampler="all", cost_model="none")
            for i in range(2)]
    assert outcome_keys(runs[0]) == outcome_keys(runs[1])
    assert len({tuple(r.config) for r in runs[0].records}) == 60
    other = tune(tmp_path / "other", TILING_64, trials=60, seed=1, search=search, sampler="all", cost_model="none")
    assert search == "gbfs" or outcome_keys(other) != outcome_keys(runs[0])


@pytest.mark.parametrize("search,saved", [("gbfs", "queue"), ("a2c", "agent")])
def test_resume_mid_run_restores_queue_and_agent(tmp_path, search, saved):
    """Stopped after 30 measurements and resumed with fresh components, the run measures what the
    straight run measured: G-BFS's queue, N-A2C's weights, Adam state, memory and s0, and the rng."""
    kwargs = {"search": search, "sampler": "all", "cost_model": "none"}
    straight = tune(tmp_path / "straight", TILING_64, trials=90, **kwargs)
    boundary = 31 if search == "gbfs" else 30  # a round ends there: 1 + 6 x 5 (gbfs: s0, then rho), 5 x 6 (a2c)
    tune(tmp_path / "resumed", TILING_64, trials=boundary, **kwargs)
    state = json.loads(next((tmp_path / "resumed" / "state").glob("*.json")).read_text())
    assert state["search"][saved]
    if search == "a2c":
        assert state["search"]["memory"] and state["search"]["center"]
    resumed = tune(tmp_path / "resumed", TILING_64, trials=90, **kwargs)
    assert outcome_keys(resumed) == outcome_keys(straight)


# ---- real TVM --------------------------------------------------------------------------------
@pytest.mark.tvm
def test_real_tiling_space_and_a_tiled_kernel_computes_the_product(tmp_path):
    from tuning.hardware.cpu import CPUHardware

    hardware = CPUHardware(num_threads=1)
    try:
        big = gemm_task("gemm_1024", 1024, 1024, 1024, space="tiling")
        space = hardware.space(big)
        assert space.size == 899_756 and space.num_sketches == 1
        assert space.decisions(space.untiled())["tile0"] == (1024, 1, 1, 1)
        task = gemm_task("gemm_64", 64, 64, 64, space="tiling")
        space = hardware.space(task)
        config = space.untiled()
        for _ in range(4):  # a few moves away from s0, one of them to an innermost factor of 64
            config = space.neighbors(config, PAPER_MOVES)[-1]
        assert space.is_legitimate(config)
        script = hardware.export(task, config, tmp_path)[0]
        checked = hardware.check_export(task, script)  # tvm.script.from_source, build, numpy's a @ b
        assert checked["correct"] and checked["max_abs_error"] < 1e-3 and checked["seconds"] > 0
    finally:
        hardware.close()
