"""The numpy actor-critic takes the step torch's autograd and Adam would take on the same network and
loss (float64), for PPO's clipped surrogate and for A2C's masked one-head loss; a saved agent comes
back whole, an agent the torch implementation saved is read, and a saved agent that does not fit is
refused."""
from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from torch import nn

from tuning.search.actor_critic import (
    LAYERS,
    ActorCritic,
    build_agent,
    choice_one_hot,
    entropy,
    policy_gradient,
    save_agent,
    taken_log_prob,
)


class TorchActorCritic(nn.Module):
    """The torch implementation the numpy one replaced (same layer names, as agents were saved)."""

    def __init__(self, inputs, hidden, heads, choices):
        super().__init__()
        self.heads, self.choices = heads, choices
        self.shared = nn.Sequential(nn.Linear(inputs, hidden), nn.Tanh())
        self.policy = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, heads * choices))
        self.value = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                   nn.Linear(hidden, 1))

    def forward(self, state, temperature=1.0, mask=None):
        logits = self.policy(self.shared(state)).view(-1, self.heads, self.choices) / temperature
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        return torch.log_softmax(logits, dim=2), self.value(self.shared(state))[:, 0]


def head_major(agent: ActorCritic) -> list:
    """The agent's arrays in torch's layout: the heads' rows head x choices + choice (numpy's are
    choice x heads + head)."""
    _, _, heads, choices = agent.shape
    arrays = [array for layer in LAYERS for array in agent.layers[layer]]
    for i in (4, 5):
        arrays[i] = arrays[i].reshape(choices, heads, -1).transpose(1, 0, 2).reshape(arrays[i].shape)
    return arrays


def torch_twin(agent: ActorCritic) -> TorchActorCritic:
    twin = TorchActorCritic(*agent.shape).double()
    with torch.no_grad():
        for parameter, array in zip(twin.parameters(), head_major(agent)):
            parameter.copy_(torch.from_numpy(array.copy()))
    return twin


def largest_difference(agent, twin) -> float:
    return max(float(np.abs(p.detach().numpy() - a).max()) for p, a in zip(twin.parameters(), head_major(agent)))


def torch_step(twin, optimizer, loss):
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(twin.parameters(), 0.5)
    optimizer.step()


def test_ppo_step_is_torchs_step():
    rng, clip, value_coef, entropy_coef, temperature = np.random.default_rng(0), 0.3, 1.0, 0.1, 0.1
    agent = ActorCritic(7, 20, 7, 3, 1e-2, seed=5)
    twin = torch_twin(agent)
    optimizer = torch.optim.Adam(twin.parameters(), lr=1e-2)
    for _ in range(6):
        state, actions = rng.random((32, 7)), rng.integers(0, 3, (32, 7))
        old_log_prob, advantage, returns = rng.normal(size=32) - 7, rng.normal(size=32), rng.normal(size=32)
        forward, taken = agent(state, temperature), choice_one_hot(actions, 3)
        ratio = np.exp(taken_log_prob(forward, taken) - old_log_prob)
        clipped = np.clip(ratio, 1 - clip, 1 + clip)
        weight = np.where(ratio * advantage <= clipped * advantage, ratio * advantage, 0.0)
        agent.learn(forward, policy_gradient(forward, taken, weight, entropy_coef),
                    value_coef * (forward.value - returns) / 32, 0.5)

        log_probs, value = twin(torch.from_numpy(state), temperature)
        taken = log_probs.gather(2, torch.from_numpy(actions)[:, :, None])[:, :, 0].sum(1)
        ratio_t = torch.exp(taken - torch.from_numpy(old_log_prob))
        advantage_t = torch.from_numpy(advantage)
        policy_loss = -torch.min(ratio_t * advantage_t, ratio_t.clamp(1 - clip, 1 + clip) * advantage_t).mean()
        value_loss = 0.5 * ((value - torch.from_numpy(returns)) ** 2).mean()
        entropy_t = -(log_probs.exp() * log_probs).sum(2).sum(1).mean()
        torch_step(twin, optimizer, policy_loss + value_coef * value_loss - entropy_coef * entropy_t)
        assert entropy(forward).mean() == pytest.approx(entropy_t.item(), rel=1e-12)
        assert largest_difference(agent, twin) < 1e-12
    assert agent.steps == 6


def test_masked_a2c_step_is_torchs_step():
    rng = np.random.default_rng(1)
    agent = ActorCritic(5, 16, 1, 9, 1e-2, seed=6)
    twin = torch_twin(agent)
    optimizer = torch.optim.Adam(twin.parameters(), lr=1e-2)
    for _ in range(6):
        state, mask = rng.random((32, 5)), rng.random((32, 1, 9)) < 0.5
        mask[:, 0, 0] = True
        actions = np.array([[rng.choice(np.flatnonzero(row[0]))] for row in mask])
        advantage = rng.normal(size=32)
        forward = agent(state, 1.0, mask)
        assert (forward.probs[~mask] == 0).all()
        logit_gradient = policy_gradient(forward, choice_one_hot(actions, 9), advantage, 0.01)
        agent.learn(forward, logit_gradient, -0.5 * advantage / 32, 0.5)

        log_probs, value = twin(torch.from_numpy(state), 1.0, torch.from_numpy(mask))
        taken = log_probs.gather(2, torch.from_numpy(actions)[:, :, None])[:, 0, 0]
        advantage_t = torch.from_numpy(advantage)
        p_log_p = log_probs.exp() * log_probs.masked_fill(~torch.from_numpy(mask), 0.0)
        loss = (-(taken * advantage_t).mean() + 0.5 * 0.5 * ((value - (advantage_t + value.detach())) ** 2).mean()
                + 0.01 * p_log_p.sum(2).sum(1).mean())
        torch_step(twin, optimizer, loss)
        assert largest_difference(agent, twin) < 1e-12


def test_saved_agent_comes_back_with_its_adam_state():
    agent = ActorCritic(4, 8, 4, 3, 1e-3, seed=1)
    forward = agent(np.ones((2, 4)))
    taken = choice_one_hot(np.zeros((2, 4), dtype=np.int64), 3)
    agent.learn(forward, policy_gradient(forward, taken, np.ones(2), 0.1), np.ones(2), 0.5)
    restored = build_agent(4, 8, 4, 3, 1e-3, seed=99, saved=save_agent(agent))
    for key in ("parameters", "moment1", "moment2"):
        assert np.array_equal(getattr(restored, key), getattr(agent, key))
    assert restored.steps == 1


def test_agent_saved_by_the_torch_implementation_is_read():
    twin = TorchActorCritic(4, 8, 4, 3)
    optimizer = torch.optim.Adam(twin.parameters(), lr=1e-3)
    log_probs, value = twin(torch.ones(2, 4))
    torch_step(twin, optimizer, -log_probs.sum() + value.sum())
    buffer = io.BytesIO()
    torch.save({"agent": twin.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    agent = build_agent(4, 8, 4, 3, 1e-3, seed=0, saved=base64.b64encode(buffer.getvalue()).decode())
    assert largest_difference(agent, twin) < 1e-7 and agent.steps == 1
    moments = ActorCritic(4, 8, 4, 3, 1e-3, seed=0)
    moments.parameters[:] = agent.moment1
    expected = [optimizer.state[p]["exp_avg"].numpy() for p in twin.parameters()]
    assert all(np.allclose(m, e) for m, e in zip(head_major(moments), expected))


@pytest.mark.parametrize("saved,message", [
    (save_agent(ActorCritic(5, 8, 4, 3, 1e-3, seed=0)), "has shape"),
    (base64.b64encode(b"PK\x03\x04 not a zip").decode(), "unreadable"),
    (base64.b64encode(b"\x80\x04 a pickle").decode(), "unreadable"),
])
def test_a_saved_agent_that_does_not_fit_is_refused(saved, message):
    with pytest.raises(ValueError, match=message):
        build_agent(4, 8, 4, 3, 1e-3, seed=0, saved=saved)
