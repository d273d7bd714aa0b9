"""search=a2c: N-A2C, an advantage actor-critic choosing short walks around the best state so far.

Zhang, Cheng, Zang, Park, "Compiler-Level Matrix Multiplication Optimization for Deep Learning",
arXiv 2019, §4.3, Algorithm 2. No cost model: every proposal is measured (sampler=all).

One `propose` is one episode of Algorithm 2:

  1. learn    train actor and critic on the replay memory M: `train_steps` minibatches of stored
              transitions (s, a, r, s'), one-step advantage r + gamma V(s') - V(s) (GAE with
              lambda = 0, shared with search=ppo), policy loss -log pi(a|s) x advantage, value
              loss 0.5 advantage^2, an entropy bonus. (Algorithm 2 trains after measuring; here
              it happens at the start of the next episode, which is the same order.)
  2. walk     from s0, the best state measured so far (the untiled start before any measurement),
              walks of T steps: each step takes a move of the space (Space.actions: a prime factor
              between two levels of a tile, Eq. 6, or +-1 on another knob), a random one with
              probability epsilon and otherwise one drawn from the actor's policy pi(s). Moves that
              do not apply (Space.step gives None) are masked out of pi; a move to an illegitimate
              state is dropped and another drawn. Every state reached that was never measured is
              collected, until the batch (the plan) is full.
  3. measure  the sampler measures the batch; `observe` stores every walk transition that ended in
              a measured state with its reward (Eq. 8: r = 1/cost, here as GFLOP/s-like 1/cost
              divided by the largest in memory at training time, so the critic's targets stay in
              [0, 1]; a failed state has r = 0) and moves s0 to the best state measured so far.

Algorithm 2 as printed follows pi with probability epsilon and acts at random otherwise; with the
epsilon = 0.1 of the known re-implementations that would be 90% random moves, so tunelab reads it as
the usual epsilon-greedy: random with probability epsilon (docs/methods.md §G-BFS and N-A2C).
A round whose walks find no unvisited state within `max_walks` walks is topped up with random
unvisited configs (tunelab's: Algorithm 2 would loop for ever).
"""
from __future__ import annotations

import numpy as np

from tuning.core.component import Hyper
from tuning.search.actor_critic import (
    blas_threads,
    build_agent,
    choice_one_hot,
    entropy,
    generalized_advantages,
    policy_gradient,
    save_agent,
    taken_log_prob,
)
from tuning.search.base import Search, fill_with_random


class NeighbourhoodA2C(Search):
    """N-A2C (module docstring). No code was published; where the paper (§5) is silent the values come
    from the known re-implementations (docs/methods.md §G-BFS and N-A2C) or are tunelab's, as marked."""

    requires = {"sampler": ("candidates_only",), "cost_model": ("trains_nothing",)}
    hyperparameters = {
        "walk_steps": Hyper(3, low=1, help="T, steps of one walk from s0",
                            cite="§5: \"the maximum number of search steps T = 3\""),
        "epsilon": Hyper(0.1, low=0.0, high=1.0, help="share of random moves",
                         cite="known re-implementations. Algorithm 2 as printed follows the policy with "
                         "probability epsilon; tunelab reads it as the usual epsilon-greedy (random with "
                         "probability epsilon), see the module docstring"),
        "hidden": Hyper(128, low=1, help="width of the hidden layers", cite="known re-implementations"),
        "learning_rate": Hyper(1e-3, low=1e-12, help="Adam step size", cite="known re-implementations"),
        "gamma": Hyper(0.9, low=0.0, high=1.0, help="discount of V(s')",
                       cite="tunelab's: search=ppo's discount (Chameleon Table 9); the paper gives none"),
        "memory_size": Hyper(1000, low=1, help="transitions kept in the replay memory M",
                             cite="tunelab's (the paper: \"a fixed-size memory buffer\")"),
        "train_steps": Hyper(8, low=0, help="minibatch updates per episode",
                             cite="tunelab's (the paper: \"incrementally-train\")"),
        "minibatch_size": Hyper(32, low=1, help="transitions per update", cite="tunelab's: search=ppo's minibatch"),
        "value_coef": Hyper(0.5, low=0.0, help="value-loss weight",
                            cite="the A2C of OpenAI baselines (vf_coef 0.5) / Stable-Baselines3; the network is "
                            "search=ppo's (tuning/search/actor_critic.py) with one head over every move of the space"),
        "entropy_coef": Hyper(0.01, low=0.0, help="entropy bonus", cite="the A2C of OpenAI baselines (ent_coef 0.01)"),
        "max_grad_norm": Hyper(0.5, low=1e-6, help="gradient-norm clip",
                               cite="the A2C of OpenAI baselines (max_grad_norm 0.5) / Stable-Baselines3"),
        "max_walks": Hyper(200, low=1, help="walks per episode before topping up with random configs",
                           cite="tunelab's cap on walks per episode (Algorithm 2 loops until the batch is full); a "
                           "shortfall is topped up with random unvisited configs"),
        "default_plan_size": Hyper(6, low=1, help="states measured per episode, len(B_test)",
                                   cite="known re-implementations"),
        "threads": Hyper(1, low=1, help="BLAS threads",
                         cite="tunelab's: as search=ppo, the same records for a seed on every host"),
    }

    def __init__(self, walk_steps: int = 3, epsilon: float = 0.1, hidden: int = 128, learning_rate: float = 1e-3,
                 gamma: float = 0.9, memory_size: int = 1000, train_steps: int = 8, minibatch_size: int = 32,
                 value_coef: float = 0.5, entropy_coef: float = 0.01, max_grad_norm: float = 0.5,
                 max_walks: int = 200, default_plan_size: int = 6, threads: int = 1):
        self.walk_steps = walk_steps
        self.epsilon = epsilon
        self.hidden = hidden
        self.learning_rate = learning_rate
        self.gamma = gamma
        self.memory_size = memory_size
        self.train_steps = train_steps
        self.minibatch_size = minibatch_size
        self.value_coef = value_coef
        self.entropy_coef = entropy_coef
        self.max_grad_norm = max_grad_norm
        self.max_walks = max_walks
        self.default_plan_size = default_plan_size
        self.threads = threads
        self.agent = None  # ActorCritic with one head over Space.actions(), on the first propose
        self.saved_agent: str | None = None
        self.memory: list[list] = []  # [state, action index, reward (1/cost, 0 if failed), next state]
        self.center: list[int] | None = None  # s0: the best state measured so far
        self.best_cost = float("inf")
        self.walked: list[list] = []  # this episode's transitions, resolved in observe
        self.last_round: dict = {}

    # ---- one episode -------------------------------------------------------------------------
    def propose(self, space, cost_model, n, visited, rng):
        with blas_threads(self.threads):
            self._ensure_agent(space, rng)
            losses = self._learn(space, rng)
            start = tuple(self.center) if self.center is not None else space.untiled()
            collected = [] if start in visited or not space.is_legitimate(start) else [start]
            walks = self._walk(space, start, n, visited, collected, rng)
        self.last_round = {"walks": walks, "collected": len(collected), "memory": len(self.memory), **losses}
        return fill_with_random(collected, space, visited, n, rng)

    def _walk(self, space, start, n, visited, collected, rng) -> int:
        """Walks of `walk_steps` from `start` until `n` unvisited states are collected; returns the count."""
        self.walked = []
        walks = 0
        while len(collected) < n and walks < self.max_walks:
            walks += 1
            state = start
            for _ in range(self.walk_steps):
                moved = self._act(space, state, rng)
                if moved is None:
                    break
                action, following = moved
                self.walked.append([list(state), action, list(following)])
                if following not in visited and following not in collected and len(collected) < n:
                    collected.append(following)
                state = following
        return walks

    def _act(self, space, state, rng):
        """(action index, next state) by epsilon-greedy over the legitimate moves, or None if none."""
        mask = applicable(space, state)
        explore = rng.random() < self.epsilon
        probs = self.agent(space.unit_features([state]), 1.0, mask[None, None, :]).probs[0, 0]
        while mask.any():
            weights = mask / mask.sum() if explore else np.where(mask, probs, 0.0)
            if weights.sum() <= 0:
                weights = mask / mask.sum()
            action = int(rng.choice(len(mask), p=weights / weights.sum()))
            following = space.canonical(space.step(state, space.actions()[action]))
            if space.is_legitimate(following):
                return action, following
            mask[action] = False
        return None

    def _learn(self, space, rng) -> dict:
        """`train_steps` A2C updates on minibatches drawn from the memory."""
        if not self.memory or self.train_steps == 0:
            return {}
        scale = max(max(m[2] for m in self.memory), 1e-30)
        diagnostics = []
        for _ in range(self.train_steps):
            picks = rng.integers(len(self.memory), size=min(self.minibatch_size, len(self.memory)))
            batch = [self.memory[int(i)] for i in picks]
            diagnostics.append(self.update(space, [b[0] for b in batch], [b[1] for b in batch],
                                           [b[2] / scale for b in batch], [b[3] for b in batch]))
        return {key: float(np.mean([d[key] for d in diagnostics])) for key in diagnostics[0]}

    def update(self, space, states, actions, rewards, next_states) -> dict:
        """One A2C gradient step on transitions (s, a, r, s'); returns its losses."""
        masks = np.stack([applicable(space, tuple(s)) for s in states])[:, None, :]
        next_value = self.agent(space.unit_features([tuple(s) for s in next_states])).value
        policy = self.agent(space.unit_features([tuple(s) for s in states]), 1.0, masks)
        reward = np.asarray(rewards, dtype=np.float64)[None, :]
        advantage = generalized_advantages(reward, policy.value[None, :], np.zeros_like(reward), next_value,
                                           self.gamma, 0.0)[0]
        taken = choice_one_hot(np.asarray(actions, dtype=np.int64)[:, None], len(space.actions()))
        policy_loss = -(taken_log_prob(policy, taken) * advantage).mean()
        # the critic's target is advantage + V(s), held fixed: its gradient is -advantage
        self.agent.learn(policy, policy_gradient(policy, taken, advantage, self.entropy_coef),
                         -self.value_coef * advantage / len(advantage), self.max_grad_norm)
        return {"policy_loss": float(policy_loss), "value_loss": float(0.5 * (advantage ** 2).mean()),
                "entropy": float(entropy(policy).mean())}

    def metrics(self) -> dict:
        return dict(self.last_round)

    # ---- measurements, agent, resume ---------------------------------------------------------
    def observe(self, configs, results):
        measured = {tuple(int(c) for c in config): result for config, result in zip(configs, results)}
        for state, action, following in self.walked:
            result = measured.get(tuple(following))
            if result is not None:
                self.memory.append([state, action, 1.0 / result.cost if result.ok else 0.0, following])
        self.memory = self.memory[-self.memory_size:]
        self.walked = []
        for config, result in measured.items():
            if result.ok and result.cost < self.best_cost:
                self.best_cost, self.center = float(result.cost), list(config)

    def _ensure_agent(self, space, rng) -> None:
        if self.agent is None:
            seed = 0 if self.saved_agent is not None else int(rng.integers(2**62))
            self.agent = build_agent(space.feature_width, self.hidden, 1, len(space.actions()), self.learning_rate,
                                     seed, self.saved_agent)

    def state_dict(self) -> dict:
        agent = self.saved_agent if self.agent is None else save_agent(self.agent)
        best = self.best_cost if np.isfinite(self.best_cost) else None
        return {"agent": agent, "memory": self.memory, "center": self.center, "best_cost": best}

    def load_state_dict(self, state: dict) -> None:
        self.saved_agent = state.get("agent")
        self.memory = [[[int(c) for c in s], int(a), float(r), [int(c) for c in t]]
                       for s, a, r, t in state.get("memory", [])]
        center = state.get("center")
        self.center = None if center is None else [int(c) for c in center]
        best = state.get("best_cost")
        self.best_cost = float("inf") if best is None else float(best)
        self.agent = None


def applicable(space, state) -> np.ndarray:
    """Which of the space's actions change `state` (bool, one per action)."""
    return np.array([space.step(tuple(state), action) is not None for action in space.actions()], dtype=bool)
