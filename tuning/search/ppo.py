"""search=ppo: Chameleon's Adaptive Exploration, a PPO agent walking the knob space.

Ahn et al., "Chameleon: adaptive code optimization for expedited DNN
compilation", ICLR 2020, §3.2 (and ReLeASE, 2019, §4.1). One `propose` is one
iteration of their optimization:

  1. start  `episodes` walkers: the best configs measured so far (from
            `observe`), the rest random ("a set of initial configurations").
  2. walk   every step the policy emits, for every knob, decrement / stay /
            increment (one categorical head per knob; the state is the knob
            indices normalised by each knob's size) and the configuration
            updater applies them all (Space.step_all). A walker's episode ends
            when at least `converged_fraction` of its movable knobs did not move
            (stay, or stuck at a boundary), or after `max_steps`; the round ends
            when every walker has ended or `early_stop` steps brought no new
            top-n config (the published optimizer's rule, as AutoTVM's SA).
  3. reward the cost model scores every config on the walks: no hardware in
            the inner loop. A step's reward is the prediction for the config it
            reached, standardised over the round (cost models promise only an
            order, not a scale).
  4. learn  PPO (clipped surrogate, GAE, value and entropy terms) on the
            round's transitions. The agent and its optimizer persist across
            rounds and resumes; that reuse is the claimed edge over SA.
  5. return the n best-predicted distinct unmeasured configs seen on the walks,
            the candidate set s_Θ handed to the sampler.

Per round it logs (search/*) the walk (steps, transitions, mean_score) and, as CleanRL's ppo.py
does, the update's policy_loss, value_loss, entropy, approx_kl, clipfrac (each the mean over the
update's minibatches) and explained_variance: what a sweep of clip / entropy_coef / value_coef
needs to see.

All randomness comes from the run's rng: the network's initial weights are
drawn from a seed taken from it, and actions are sampled from the policy's probabilities. The
network is numpy (tuning/search/actor_critic.py: torch's per-operation overhead was most of a
replayed run) on `threads` BLAS threads (1): float sums depend on the thread count, so one thread
keeps a seed's records the same whatever the host's core count.
"""
from __future__ import annotations

import numpy as np

from tuning.core.component import Hyper
from tuning.search.actor_critic import (
    blas_threads,
    build_agent,
    choice_one_hot,
    entropy,
    explained_variance,
    generalized_advantages,
    policy_gradient,
    save_agent,
    taken_log_prob,
)
from tuning.search.base import CachedScores, Search, TopN, fill_with_random

DIRECTIONS = 3  # decrement, stay, increment: action a moves a knob by a - 1


class PPO(Search):
    """Chameleon's PPO agent (module docstring). Its hyperparameters come from Chameleon Tables 7 and 9;
    where the paper is silent, from its published code (docs/methods.md §Chameleon)."""

    requires = {"cost_model": ("can_rank",)}
    hyperparameters = {
        "episodes": Hyper(128, low=1, help="walkers per round",
                          cite="Chameleon Table 7, \"number of episodes for reinforcement learning\""),
        "max_steps": Hyper(500, low=1, help="step cap of one episode",
                           cite="Chameleon Table 7, \"maximum steps of one reinforcement learning episode\""),
        "early_stop": Hyper(50, low=1, help="end the round after this many steps without a new top-n config",
                            cite="tunelab's choice, after AutoTVM's SA (a round ends after 50 steps with no new "
                            "top-b config). The published code passes early_stop=50 to its optimizer but never "
                            "applies it; search.early_stop=500 (= max_steps) runs the code's unbounded episode"),
        "converged_fraction": Hyper(0.75, low=0.0, high=1.0,
                                    help="an episode ends when this share of its knobs did not move",
                                    cite="the published code: the episode ends when 75% of knobs stay or are stuck"),
        "best_starts": Hyper(16, low=0, help="walkers that start from the best measured configs",
                             cite="tunelab's choice (the paper: \"a set of initial configurations\"). It gives "
                             "PPO's walkers a head start search=sa does not get; search.best_starts=0 is the "
                             "control that starts every walker at random (+experiment=chameleon_replay has both)"),
        "learning_rate": Hyper(1e-3, low=1e-12, help="Adam step size",
                               cite="Chameleon Table 9 (= ReLeASE Table 2): Adam step 1e-3"),
        "gamma": Hyper(0.9, low=0.0, high=1.0, help="discount factor", cite="Chameleon Table 9: discount 0.9"),
        "gae_lambda": Hyper(0.99, low=0.0, high=1.0, help="GAE parameter", cite="Chameleon Table 9: GAE 0.99"),
        "epochs": Hyper(3, low=1, help="PPO epochs per round", cite="Chameleon Table 9: 3 epochs"),
        "clip": Hyper(0.3, low=1e-6, help="clipping parameter",
                      cite="Chameleon Table 9: clip 0.3. The code's clip 0.2 differs from the paper: set clip=0.2 "
                      "entropy_coef=0.3 to run the code's choice"),
        "value_coef": Hyper(1.0, low=0.0, help="value-loss coefficient", cite="Chameleon Table 9: value coef 1.0"),
        "entropy_coef": Hyper(0.1, low=0.0, help="entropy coefficient",
                              cite="Chameleon Table 9: entropy coef 0.1. The code's entropy 0.3 differs from the "
                              "paper: set clip=0.2 entropy_coef=0.3 to run the code's choice"),
        "minibatch_size": Hyper(32, low=1, help="transitions per gradient step",
                                cite="the published code (docs/methods.md §Chameleon): minibatch 32"),
        "hidden": Hyper(20, low=1, help="width of every hidden layer",
                        cite="the published code: 20-unit tanh layers (2 policy, 3 value, first shared, as the "
                        "paper says)"),
        "temperature": Hyper(0.1, low=1e-6, help="softmax temperature of the knob heads",
                             cite="the published code: softmax temperature 0.1"),
        "max_grad_norm": Hyper(0.5, low=1e-6, help="gradient-norm clip",
                               cite="the PPO reference implementations' default"),
        "default_plan_size": Hyper(64, low=1, help="configs measured per round unless budget.plan_size says otherwise",
                                   cite="Chameleon Table 7: b_GBT, the planning batch per iteration (a run's "
                                   "budget.plan_size overrides it, null keeps 64)"),
        "threads": Hyper(1, low=1, help="BLAS threads for the agent",
                         cite="tunelab's execution setting, not the paper's: the BLAS threads of the agent's numpy "
                         "network (tuning/search/actor_critic.py; the published code used TensorFlow, tunelab's "
                         "first version torch). Float sums depend on the thread count, so one thread keeps a seed's "
                         "records the same whatever the host's core count; a 20-unit network gains nothing from two"),
    }

    def __init__(self, episodes: int = 128, max_steps: int = 500, early_stop: int = 50,
                 converged_fraction: float = 0.75, best_starts: int = 16, learning_rate: float = 1e-3,
                 gamma: float = 0.9, gae_lambda: float = 0.99, epochs: int = 3, clip: float = 0.3,
                 value_coef: float = 1.0, entropy_coef: float = 0.1, minibatch_size: int = 32,
                 hidden: int = 20, temperature: float = 0.1, max_grad_norm: float = 0.5,
                 default_plan_size: int = 64, threads: int = 1):
        self.episodes = episodes
        self.max_steps = max_steps
        self.early_stop = early_stop
        self.converged_fraction = converged_fraction
        self.best_starts = best_starts
        self.learning_rate = learning_rate
        self.gamma = gamma
        self.gae_lambda = gae_lambda
        self.epochs = epochs
        self.clip = clip
        self.value_coef = value_coef
        self.entropy_coef = entropy_coef
        self.minibatch_size = minibatch_size
        self.hidden = hidden
        self.temperature = temperature
        self.max_grad_norm = max_grad_norm
        self.default_plan_size = default_plan_size
        self.threads = threads
        self.agent = None  # an ActorCritic, built on the first propose, when the knob count is known
        self.best: list[tuple[float, list[int]]] = []  # (seconds, config) of the best measured configs
        self.saved_agent: str | None = None  # from load_state_dict, restored on the next propose
        self.last_round: dict = {}  # what the latest round did (steps, transitions, mean reward)

    # ---- one round -------------------------------------------------------------------------
    def propose(self, space, cost_model, n, visited, rng):
        with blas_threads(self.threads):
            self._ensure_agent(len(space.knobs), rng)
            starts = self._start_configs(space, rng)
            top = TopN(space, visited, n)
            score = CachedScores(space, cost_model)
            top.offer(list(map(tuple, starts.tolist())), score(starts))
            rollout = self._walk(space, score, starts, top, rng)
            self._learn(rollout, rng)
        return fill_with_random(top.sorted_configs(), space, visited, n, rng)

    def _start_configs(self, space, rng) -> np.ndarray:
        best = [tuple(c) for _, c in self.best[:self.best_starts] if space.is_valid(tuple(c))]
        randoms = [space.sample(rng) for _ in range(self.episodes - len(best))]
        return np.asarray((best + randoms)[:self.episodes], dtype=np.int64)

    def _walk(self, space, score, configs, top, rng) -> dict:
        """Run the episodes; returns the transitions as (steps, walkers, ...) arrays."""
        movable = _movable_mask(space)
        alive = np.ones(len(configs), dtype=bool)
        steps: list[dict] = []
        last_change = 0
        while len(steps) < self.max_steps and alive.any() and len(steps) < last_change + self.early_stop:
            state = space.normalized(configs)
            draws = rng.random(configs.shape)  # one per knob and walker, ended ones too: the same stream
            # ended walkers (most of a round's steps) stay put, unscored, unevaluated: their steps never
            # reach the update (zeros stand in)
            live = np.flatnonzero(alive)
            policy = self.agent(state[live], self.temperature)
            actions = np.ones_like(configs)
            actions[live] = _sample(policy.choice_probs, draws[live])
            moved = configs.copy()
            moved[live] = space.step_all(configs[live], actions[live] - 1)
            scores, value, log_prob = np.zeros(len(configs)), np.zeros(len(configs)), np.zeros(len(configs))
            scores[live] = score(moved[live])
            value[live] = policy.value
            log_prob[live] = taken_log_prob(policy, choice_one_hot(actions[live], DIRECTIONS))
            converged = alive & _converged(configs, moved, movable, self.converged_fraction)
            steps.append({"state": state, "actions": actions, "value": value, "log_prob": log_prob, "score": scores,
                          "alive": alive.copy(), "ends": converged})
            if top.offer(list(map(tuple, moved[alive].tolist())), scores[alive]):
                last_change = len(steps)
            configs, alive = moved, alive & ~converged
        rollout = {key: np.stack([s[key] for s in steps]) for key in steps[0]}
        rollout["final_value"] = self.agent(space.normalized(configs), self.temperature).value
        return rollout

    def _learn(self, rollout, rng) -> None:
        """PPO on the round's transitions (CleanRL's ppo.py, minus its environment loop)."""
        alive = rollout["alive"]
        scores = rollout["score"]
        reward = (scores - scores[alive].mean()) / (scores[alive].std() + 1e-8)
        advantage = generalized_advantages(reward, rollout["value"], rollout["ends"], rollout["final_value"],
                                           self.gamma, self.gae_lambda)
        returns = advantage + rollout["value"]
        data = {"state": rollout["state"][alive].astype(np.float64), "log_prob": rollout["log_prob"][alive],
                "advantage": advantage[alive], "returns": returns[alive]}
        taken = choice_one_hot(rollout["actions"][alive], DIRECTIONS)  # (choices, knobs, transitions)
        count = len(data["returns"])
        steps = []
        for _ in range(self.epochs):
            order = rng.permutation(count)
            shuffled = {key: value[order] for key, value in data.items()}
            shuffled["advantage"] = _normalised_per_minibatch(shuffled["advantage"], self.minibatch_size)
            shuffled_taken = taken[:, :, order]
            for start in range(0, count, self.minibatch_size):
                window = slice(start, start + self.minibatch_size)
                batch = {key: value[window] for key, value in shuffled.items()}
                steps.append(self._gradient_step(batch, shuffled_taken[:, :, window]))
        self.last_round = {"steps": int(len(alive)), "transitions": count, "mean_score": float(scores[alive].mean()),
                           **self._diagnostics(steps),
                           "explained_variance": explained_variance(rollout["value"][alive], returns[alive])}

    def _gradient_step(self, batch, taken) -> dict:
        """One clipped-surrogate step (the advantages come normalised per minibatch); returns the
        arrays its diagnostics are computed from."""
        policy = self.agent(batch["state"], self.temperature)
        log_ratio = taken_log_prob(policy, taken) - batch["log_prob"]
        ratio = np.exp(log_ratio)
        advantage = batch["advantage"]
        surrogate = ratio * advantage
        clipped = np.minimum(np.maximum(ratio, 1 - self.clip), 1 + self.clip) * advantage  # np.clip, less overhead
        value_error = policy.value - batch["returns"]
        surrogate_weight = np.where(surrogate <= clipped, surrogate, 0.0)  # a clipped term has no gradient
        logit_gradient = policy_gradient(policy, taken, surrogate_weight, self.entropy_coef)
        self.agent.learn(policy, logit_gradient, self.value_coef * value_error / len(value_error), self.max_grad_norm)
        return {"ratio": ratio, "log_ratio": log_ratio, "surrogate": surrogate, "clipped": clipped,
                "value_error": value_error, "entropy": entropy(policy)}

    def _diagnostics(self, steps: list[dict]) -> dict:
        """CleanRL's diagnostics, each the mean over the update's minibatches of its minibatch mean:
        policy/value loss, entropy, approx_kl (the (r - 1) - log r estimator), clipfrac (share of
        ratios outside 1 +- clip)."""
        every = {key: np.concatenate([step[key] for step in steps]) for key in steps[0]}
        ratio = every["ratio"]
        per_transition = {"policy_loss": -np.minimum(every["surrogate"], every["clipped"]),
                          "value_loss": 0.5 * every["value_error"] ** 2, "entropy": every["entropy"],
                          "approx_kl": (ratio - 1) - every["log_ratio"],
                          "clipfrac": (np.abs(ratio - 1) > self.clip).astype(np.float64)}
        sizes = np.asarray([len(step["ratio"]) for step in steps])
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        return {key: float(np.mean(np.add.reduceat(values, starts) / sizes)) for key, values in per_transition.items()}

    def metrics(self) -> dict:
        return dict(self.last_round)

    # ---- measurements, agent, resume -------------------------------------------------------
    def observe(self, configs, results):
        measured = [(r.cost, [int(c) for c in config]) for config, r in zip(configs, results) if r.ok]
        self.best = sorted(self.best + measured)[:max(self.best_starts, 1)]

    def _ensure_agent(self, knobs: int, rng) -> None:
        """One 3-way head per knob; the state is the knob indices (restored weights overwrite the seed's)."""
        if self.agent is None:
            seed = 0 if self.saved_agent is not None else int(rng.integers(2**62))
            self.agent = build_agent(knobs, self.hidden, knobs, DIRECTIONS, self.learning_rate, seed,
                                     self.saved_agent)

    def state_dict(self) -> dict:
        agent = self.saved_agent if self.agent is None else save_agent(self.agent)
        return {"agent": agent, "best": [[cost, config] for cost, config in self.best]}

    def load_state_dict(self, state: dict) -> None:
        self.saved_agent = state.get("agent")
        self.best = [(float(cost), [int(c) for c in config]) for cost, config in state.get("best", [])]
        self.agent = None


def _sample(choice_probs: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """One direction per knob per walker, (walkers, knobs), from the heads' probabilities (choices,
    knobs, walkers): each uniform draw (walkers, knobs) against its head's cumulative probabilities."""
    cumulative = choice_probs.cumsum(axis=0)
    return np.minimum((draws.T[None] > cumulative).sum(axis=0), DIRECTIONS - 1).T


def _normalised_per_minibatch(advantage: np.ndarray, size: int) -> np.ndarray:
    """Each minibatch's advantages (consecutive `size`-long windows) standardised over that
    minibatch, all at once; a minibatch of one stays as it is."""
    out = advantage.copy()
    if size == 1:
        return out
    full = len(advantage) // size * size
    if full:
        rows = advantage[:full].reshape(-1, size)
        out[:full] = ((rows - rows.mean(axis=1, keepdims=True))
                      / (rows.std(axis=1, ddof=1, keepdims=True) + 1e-8)).ravel()
    rest = advantage[full:]
    if len(rest) > 1:
        out[full:] = (rest - rest.mean()) / (rest.std(ddof=1) + 1e-8)
    return out


def _converged(configs, moved, movable, fraction) -> np.ndarray:
    """Walkers whose movable knobs mostly did not move (stay, or stuck at a boundary)."""
    can_move = movable[configs[:, 0]]
    count = can_move.sum(axis=1)
    unmoved = ((moved == configs) & can_move).sum(axis=1)
    return (count == 0) | (unmoved >= fraction * count)


def _movable_mask(space) -> np.ndarray:
    """(sketches, knobs): the knobs a config of each sketch can move."""
    dims = np.asarray(space.dims)
    mask = np.zeros((space.num_sketches, len(dims)), dtype=bool)
    for sketch, slots in enumerate(space.active):
        mask[sketch, list(slots)] = dims[list(slots)] > 1
        mask[sketch, 0] = space.num_sketches > 1
    return mask
