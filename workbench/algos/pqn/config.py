"""PQN's hyperparameters: a plain dataclass, importable without JAX."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from workbench.algos.base import (
    ACTIVATION_NAMES,
    check_choice,
    check_fields,
    check_minibatches,
    check_widths,
)


@dataclass(frozen=True)
class PQNConfig:
    """What PQN (parallel Q-learning: Q(lambda) on vectorised envs, no replay buffer, no
    target network) learns with."""

    learning_rate: float = 1e-3
    """Adam step size (linearly annealed to 0 when ``anneal_lr``)."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to zero over the run's updates."""
    gamma: float = 0.99
    """Discount factor."""
    q_lambda: float = 0.65
    """Q(lambda)'s mix of one-step and longer bootstraps (1: Monte Carlo returns)."""
    epsilon_start: float = 1.0
    """Exploration rate of the epsilon-greedy behaviour policy at the start."""
    epsilon_end: float = 0.05
    """Exploration rate after the decay."""
    epsilon_decay_fraction: float = 0.25
    """Fraction of the run's updates over which epsilon decays linearly."""
    num_epochs: int = 4
    """Passes over each batch."""
    num_minibatches: int = 16
    """Minibatches per epoch."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clip."""
    hidden_sizes: tuple[int, ...] = (128, 128)
    """Widths of the Q-network's MLP."""
    activation: Literal["tanh", "relu", "gelu", "silu"] = "relu"
    """The MLP's activation."""
    layer_norm: bool = True
    """LayerNorm after each hidden layer: what keeps Q-learning stable without a target
    network."""

    def validate(self, batch_size: int) -> None:
        """Raise ``ValueError`` naming the first field that cannot work."""
        check_fields(self, {
            "learning_rate": "positive", "gamma": "unit", "q_lambda": "unit",
            "epsilon_start": "unit", "epsilon_end": "unit",
            "epsilon_decay_fraction": "unit", "num_epochs": "positive_int",
            "num_minibatches": "positive_int", "max_grad_norm": "positive",
        })
        check_widths("hidden_sizes", self.hidden_sizes)
        check_choice("activation", self.activation, ACTIVATION_NAMES)
        check_minibatches(self.num_minibatches, batch_size)
