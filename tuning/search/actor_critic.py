"""The actor-critic pieces shared by search=ppo (Chameleon) and search=a2c (N-A2C): the network,
its gradient step, advantage estimation and the agent's (de)serialisation for resume.

    ActorCritic(inputs, hidden, heads, choices, learning_rate, seed)
        a shared tanh layer; the policy adds one tanh layer and `heads` softmax heads of `choices`
        each (PPO: one 3-way head per knob; A2C: one head over every move), the value two tanh
        layers and one output. `mask` (same shape as the heads) removes choices before the softmax.
        `learn` back-propagates the loss's gradients with respect to the heads' logits and the value,
        clips the gradient's norm and takes one Adam step.
    policy_gradient(...)          those logit gradients for -mean(weight x log pi(a|s)) - c x entropy,
                                  the policy term of both PPO's and A2C's loss (the actions taken as
                                  choice_one_hot masks)
    generalized_advantages(...)   GAE over (steps, walkers) arrays; lambda = 0 and one step is the
                                  one-step TD error r + gamma V(s') - V(s) that A2C uses

The network is numpy, not torch: it is a few 20-128 unit layers, where torch's per-operation
overhead was most of a replayed PPO run (each gradient step is ~60 small operations; torch spent
~1 ms a step, numpy ~0.1 ms: experiments/bench_replay.py). The layers, their initialisation
(torch.nn.Linear's U(+-1/sqrt(fan_in))), the losses and Adam (torch's defaults) are the same; the
arithmetic is float64 and the log-probabilities are an exact log-softmax where torch's version took
log(max(p, 1e-12)), so the same seed draws other weights and walks than the torch agent did.
All parameters live in one flat vector (as do their gradients and Adam's moments), so the gradient
norm and the Adam step are a handful of operations whatever the layer count.
"""
from __future__ import annotations

import base64
import io
import math
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from threadpoolctl import threadpool_limits

ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults
ADAM_EPS = 1e-8
LAYERS = ("shared", "policy", "heads", "value1", "value2", "value_out")
TORCH_NAMES = ("shared.0", "policy.0", "policy.2", "value.0", "value.2", "value.4")  # agents saved by torch


@contextmanager
def blas_threads(count: int):
    """numpy's BLAS thread count capped for the block: float sums depend on it."""
    with threadpool_limits(limits=count, user_api="blas"):
        yield


@dataclass
class Forward:
    """One forward pass: what the losses read, and what `learn` back-propagates through. The network
    works with the batch along the last axis (weights @ inputs), where numpy's reductions over a head's
    few choices are fast: `choice_probs` and `choice_log_probs` are (choices, heads, batch); `probs` and
    `log_probs` give the same numbers as (batch, heads, choices) views."""
    choice_probs: np.ndarray  # a masked choice is 0
    choice_log_probs: np.ndarray  # a masked choice is -inf
    value: np.ndarray  # (batch,)
    activations: tuple  # the inputs and every tanh layer's output, (width, batch) each
    temperature: float
    masked: bool

    @property
    def probs(self) -> np.ndarray:
        return self.choice_probs.transpose(2, 1, 0)

    @property
    def log_probs(self) -> np.ndarray:
        return self.choice_log_probs.transpose(2, 1, 0)

    @cached_property
    def p_log_p(self) -> np.ndarray:
        """p log p per choice, (choices, heads, batch); 0 for a masked choice."""
        if not self.masked:
            return self.choice_probs * self.choice_log_probs
        with np.errstate(invalid="ignore"):  # a masked choice: 0 x -inf
            return np.where(self.choice_probs > 0, self.choice_probs * self.choice_log_probs, 0.0)


class ActorCritic:
    def __init__(self, inputs: int, hidden: int, heads: int, choices: int, learning_rate: float, seed: int):
        self.shape = (inputs, hidden, heads, choices)
        self.learning_rate = learning_rate
        total = _parameter_count(self.shape)
        self.parameters = np.zeros(total)
        self.gradient = np.zeros(total)
        self.moment1 = np.zeros(total)
        self.moment2 = np.zeros(total)
        self.steps = 0
        self.layers = _views(self.parameters, self.shape)
        self.gradients = _views(self.gradient, self.shape)
        rng = np.random.default_rng(seed)
        for layer in LAYERS:
            weight, bias = self.layers[layer]
            bound = 1.0 / np.sqrt(weight.shape[1])
            weight[:] = rng.uniform(-bound, bound, weight.shape)
            bias[:] = rng.uniform(-bound, bound, bias.shape)

    def __call__(self, state, temperature: float = 1.0, mask=None) -> Forward:
        """state (batch, inputs); mask (batch, heads, choices), False removes a choice."""
        layers = self.layers
        _, hidden, heads, choices = self.shape
        inputs = np.asarray(state, dtype=np.float64).T
        shared = _tanh_layer(layers["shared"], inputs)
        branches = _tanh_layer(layers["branches"], shared)  # the policy's and the value's first layers at once
        logits = _layer(layers["heads"], branches[:hidden]).reshape(choices, heads, -1)
        logits *= 1.0 / temperature
        if mask is not None:
            logits = np.where(np.asarray(mask, dtype=bool).transpose(2, 1, 0), logits, -np.inf)
        log_probs = _log_softmax(logits, masked=mask is not None)
        value2 = _tanh_layer(layers["value2"], branches[hidden:])
        value = _layer(layers["value_out"], value2)[0]
        return Forward(np.exp(log_probs), log_probs, value, (inputs, shared, branches, value2), temperature,
                       mask is not None)

    def learn(self, forward: Forward, logit_gradient: np.ndarray, value_gradient: np.ndarray,
              max_grad_norm: float) -> None:
        """One Adam step on the loss whose gradients with respect to the (tempered) logits, as
        `policy_gradient` gives them, and to the value (batch,) are given, after clipping the gradient's
        norm to `max_grad_norm` (torch's rule)."""
        self._backward(forward, logit_gradient, value_gradient)
        gradient, moment1, moment2 = self.gradient, self.moment1, self.moment2
        gradient *= min(1.0, max_grad_norm / (np.sqrt(gradient @ gradient) + 1e-6))
        beta1, beta2 = ADAM_BETAS
        self.steps += 1
        moment1 += (1 - beta1) * (gradient - moment1)
        moment2 += (1 - beta2) * (gradient * gradient - moment2)
        denominator = np.sqrt(moment2)
        denominator *= 1.0 / np.sqrt(1 - beta2 ** self.steps)
        denominator += ADAM_EPS
        self.parameters -= (self.learning_rate / (1 - beta1 ** self.steps)) * moment1 / denominator

    def _backward(self, forward: Forward, logit_gradient, value_gradient) -> None:
        inputs, shared, branches, value2 = forward.activations
        layers, grads = self.layers, self.gradients
        hidden = self.shape[1]
        into_branches = np.empty_like(branches)
        up = logit_gradient.reshape(-1, inputs.shape[1]) * (1.0 / forward.temperature)
        _layer_grads(grads["heads"], up, branches[:hidden])
        np.matmul(layers["heads"][0].T, up, out=into_branches[:hidden])
        up = np.asarray(value_gradient, dtype=np.float64)[None, :]
        _layer_grads(grads["value_out"], up, value2)
        up = (layers["value_out"][0].T @ up) * (1 - value2 * value2)
        _layer_grads(grads["value2"], up, branches[hidden:])
        np.matmul(layers["value2"][0].T, up, out=into_branches[hidden:])
        into_branches *= 1 - branches * branches
        _layer_grads(grads["branches"], into_branches, shared)
        up = (layers["branches"][0].T @ into_branches) * (1 - shared * shared)
        _layer_grads(grads["shared"], up, inputs)


def choice_one_hot(actions, choices: int) -> np.ndarray:
    """The actions taken, (batch, heads) choice indices, as the (choices, heads, batch) bool mask the
    losses below read."""
    return np.asarray(actions).T[None, :, :] == np.arange(choices)[:, None, None]


def policy_gradient(forward: Forward, taken: np.ndarray, weights: np.ndarray, entropy_coef: float) -> np.ndarray:
    """d loss / d logits (as `learn` takes them) for loss = -mean_b(weights_b x log pi(a_b | s_b))
    - entropy_coef x mean_b H_b, where log pi sums over the heads (`taken`: choice_one_hot of the
    actions) and H_b is the heads' summed entropy. PPO's clipped surrogate is this with weights =
    ratio x advantage where the unclipped term is the minimum (0 elsewhere); A2C's is weights = advantage."""
    probs = forward.choice_probs
    p_log_p = forward.p_log_p
    batch = probs.shape[2]
    # d(-H)/dz_j = p_j (log p_j + H) for one softmax head; d(-log p_a)/dz_j = p_j - [j = a]
    return ((np.asarray(weights) / batch) * (probs - taken)
            + (entropy_coef / batch) * (p_log_p - probs * p_log_p.sum(axis=0)))


def entropy(forward: Forward) -> np.ndarray:
    """(batch,): each state's entropy, summed over the heads."""
    return -forward.p_log_p.sum(axis=(0, 1))


def taken_log_prob(forward: Forward, taken: np.ndarray) -> np.ndarray:
    """(batch,): log pi(a | s) of the actions `taken` (choice_one_hot), summed over the heads."""
    return np.where(taken, forward.choice_log_probs, 0.0).sum(axis=(0, 1))


def build_agent(inputs: int, hidden: int, heads: int, choices: int, learning_rate: float, seed: int,
                saved: str | None = None) -> ActorCritic:
    """The agent, its initial weights drawn from `seed`, or restored from `saved` (a `save_agent`
    string, or an agent the torch implementation saved). A saved agent of another shape is refused."""
    agent = ActorCritic(inputs, hidden, heads, choices, learning_rate, seed)
    if saved is not None:
        raw = base64.b64decode(saved)
        arrays = _load_npz(raw)
        if arrays is None:
            arrays = _from_torch(raw, agent.shape)
        _restore(agent, arrays)
    return agent


def save_agent(agent: ActorCritic) -> str:
    """The agent and its Adam state as a JSON-safe string (a search's state_dict)."""
    buffer = io.BytesIO()
    np.savez(buffer, shape=np.asarray(agent.shape), parameters=agent.parameters, moment1=agent.moment1,
             moment2=agent.moment2, steps=np.asarray(agent.steps))
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


# ---- layers (the batch along the last axis) ------------------------------------------------------
def _layout(shape: tuple) -> list[tuple[int, ...]]:
    """The flat vector's arrays in order, each layer's weight then bias: the shared layer, the policy's
    and the value's first layers one above the other ("branches": both read the shared layer), the
    heads (rows choice-major: choice x heads + head), the value's second layer, the value."""
    inputs, hidden, heads, choices = shape
    return [(hidden, inputs), (hidden,), (2 * hidden, hidden), (2 * hidden,), (heads * choices, hidden),
            (heads * choices,), (hidden, hidden), (hidden,), (1, hidden), (1,)]


def _parameter_count(shape: tuple) -> int:
    return sum(math.prod(dims) for dims in _layout(shape))


def _views(flat: np.ndarray, shape: tuple) -> dict:
    """{layer: (weight, bias)} as views into `flat` (_layout), "policy" and "value1" within "branches"."""
    arrays, offset = [], 0
    for dims in _layout(shape):
        arrays.append(flat[offset:offset + math.prod(dims)].reshape(dims))
        offset += math.prod(dims)
    shared, branches, heads, value2, value_out = zip(arrays[::2], arrays[1::2])
    hidden = shape[1]
    return {"shared": shared, "branches": branches, "heads": heads, "value2": value2, "value_out": value_out,
            "policy": (branches[0][:hidden], branches[1][:hidden]),
            "value1": (branches[0][hidden:], branches[1][hidden:])}


def _layer(layer, inputs):
    weight, bias = layer
    return weight @ inputs + bias[:, None]


def _tanh_layer(layer, inputs):
    return np.tanh(_layer(layer, inputs))


def _layer_grads(layer_grads, up, inputs) -> None:
    weight_grad, bias_grad = layer_grads
    np.matmul(up, inputs.T, out=weight_grad)
    up.sum(axis=1, out=bias_grad)


def _log_softmax(logits, masked: bool):
    """Over the choices (axis 0). A fully masked head stays -inf rather than nan."""
    top = logits.max(axis=0)
    if masked:
        top = np.where(np.isfinite(top), top, 0.0)
    shifted = logits - top
    with np.errstate(divide="ignore"):
        normaliser = np.log(np.exp(shifted).sum(axis=0))
    if masked:
        normaliser = np.where(np.isfinite(normaliser), normaliser, 0.0)
    shifted -= normaliser
    return shifted


# ---- saved agents (untrusted: a run folder's state) ----------------------------------------------
def _load_npz(raw: bytes) -> dict | None:
    """The arrays of a save_agent string; None when it is not one (a torch-saved agent)."""
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as saved:
            if "parameters" not in saved.files:
                return None
            return {key: saved[key] for key in ("shape", "parameters", "moment1", "moment2", "steps")}
    except (ValueError, OSError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(f"the saved agent is unreadable: {error}") from error


def _from_torch(raw: bytes, shape: tuple) -> dict:
    """The arrays of an agent and Adam state saved by the torch implementation: the same layers
    (LAYERS, named TORCH_NAMES there), but the heads' rows were head-major (head x choices + choice)."""
    import torch  # only to read agents saved before the network was numpy

    _, _, heads, choices = shape

    def flat(tensors) -> np.ndarray:
        out = np.zeros(_parameter_count(shape))
        views = _views(out, shape)
        for i, layer in enumerate(LAYERS):
            for j, array in enumerate(views[layer]):
                value = tensors[2 * i + j].double().numpy()
                if layer == "heads":
                    value = value.reshape(heads, choices, -1).transpose(1, 0, 2).reshape(value.shape)
                array[:] = value
        return out

    try:
        state = torch.load(io.BytesIO(raw), weights_only=True)
        names = [f"{layer}.{kind}" for layer in TORCH_NAMES for kind in ("weight", "bias")]
        adam = [state["optimizer"]["state"].get(i) for i in range(len(names))]
        started = all(entry is not None for entry in adam)
        parameters = flat([state["agent"][name] for name in names])
        return {"parameters": parameters,
                "moment1": flat([entry["exp_avg"] for entry in adam]) if started else np.zeros_like(parameters),
                "moment2": flat([entry["exp_avg_sq"] for entry in adam]) if started else np.zeros_like(parameters),
                "steps": np.asarray(int(adam[0]["step"]) if started else 0), "shape": None}
    except Exception as error:  # torch.load raises whatever its unpickler meets
        raise ValueError(f"the saved agent is unreadable: {type(error).__name__}: {error}") from error


def _restore(agent: ActorCritic, arrays: dict) -> None:
    if arrays["shape"] is not None and tuple(int(v) for v in arrays["shape"]) != agent.shape:
        raise ValueError(f"the saved agent has shape {tuple(arrays['shape'])} (inputs, hidden, heads, choices); "
                         f"this run's is {agent.shape}")
    for key in ("parameters", "moment1", "moment2"):
        if arrays[key].shape != agent.parameters.shape or not np.isfinite(arrays[key]).all():
            raise ValueError(f"the saved agent's {key} do not fit this run's network (or are not finite)")
        getattr(agent, key)[:] = arrays[key]
    agent.steps = int(arrays["steps"])
