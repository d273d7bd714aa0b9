"""The actor-critic pieces shared by search=ppo (Chameleon) and search=a2c (N-A2C): the network,
advantage estimation, torch thread control and the agent's (de)serialisation for resume.

    ActorCritic(inputs, hidden, heads, choices)
        a shared tanh layer; the policy adds one tanh layer and `heads` softmax heads of `choices`
        each (PPO: one 3-way head per knob; A2C: one head over every move), the value two tanh
        layers and one output. `mask` (same shape as the heads) removes choices before the softmax.
    generalized_advantages(...)   GAE over (steps, walkers) arrays; lambda = 0 and one step is the
                                  one-step TD error r + gamma V(s') - V(s) that A2C uses
"""
from __future__ import annotations

import base64
import io
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn


@contextmanager
def torch_threads(count: int):
    """torch's intra-op thread count set for the block, and put back."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class ActorCritic(nn.Module):
    def __init__(self, inputs: int, hidden: int, heads: int, choices: int):
        super().__init__()
        self.heads, self.choices = heads, choices
        self.shared = nn.Sequential(nn.Linear(inputs, hidden), nn.Tanh())
        self.policy = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, heads * choices))
        self.value = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                   nn.Linear(hidden, 1))

    def forward(self, state, temperature: float = 1.0, mask=None):
        """(probabilities (batch, heads, choices), value (batch, 1))."""
        features = self.shared(state)
        logits = self.policy(features).view(-1, self.heads, self.choices) / temperature
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        return torch.softmax(logits, dim=2), self.value(features)


def build_agent(inputs: int, hidden: int, heads: int, choices: int, learning_rate: float, seed: int,
                saved: str | None = None):
    """(agent, Adam optimizer): initial weights drawn under `seed` without touching torch's global
    RNG, or restored from `saved` (a `save_agent` string)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        agent = ActorCritic(inputs, hidden, heads, choices)
    optimizer = torch.optim.Adam(agent.parameters(), lr=learning_rate)
    if saved is not None:
        state = torch.load(io.BytesIO(base64.b64decode(saved)), weights_only=True)
        agent.load_state_dict(state["agent"])
        optimizer.load_state_dict(state["optimizer"])
    return agent, optimizer


def save_agent(agent, optimizer) -> str:
    """The agent and its optimizer as a JSON-safe string (a search's state_dict)."""
    buffer = io.BytesIO()
    torch.save({"agent": agent.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def generalized_advantages(reward, value, ends, final_value, gamma, lam) -> np.ndarray:
    """GAE over (steps, walkers) arrays. `ends[t]` marks a walker's last step (converged);
    walkers still going after the last step are bootstrapped from `final_value`. Steps after
    a walker ended are garbage that its `ends` step cuts off."""
    advantage = np.zeros_like(reward)
    running = np.zeros(reward.shape[1])
    next_value = final_value
    for t in reversed(range(len(reward))):
        going = 1.0 - ends[t]
        delta = reward[t] + gamma * next_value * going - value[t]
        running = delta + gamma * lam * going * running
        advantage[t] = running
        next_value = value[t]
    return advantage


def explained_variance(predicted: np.ndarray, returns: np.ndarray) -> float:
    """1 - Var(returns - value) / Var(returns): 1 is a perfect critic, <= 0 no better than a constant."""
    spread = np.var(returns)
    return float("nan") if spread == 0 else float(1 - np.var(returns - predicted) / spread)
