"""PPO's hyperparameters: a plain dataclass, importable without JAX (the command line and
config files read it before anything heavy loads)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from workbench.algos.base import (
    ACTIVATION_NAMES,
    check_choice,
    check_fields,
    check_minibatches,
    check_widths,
)


@dataclass(frozen=True)
class PPOConfig:
    """What PPO learns with; where it runs is configured elsewhere."""

    learning_rate: float = 5e-4
    """Adam step size (linearly annealed to 0 over the run when ``anneal_lr``)."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to zero over the run's updates."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE's bias-variance trade-off."""
    clip_eps: float = 0.2
    """PPO's ratio clipping range."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    num_epochs: int = 4
    """Passes over each batch."""
    num_minibatches: int = 16
    """Minibatches per epoch; the global minibatch is the global batch over this."""
    normalize_advantages: bool = True
    """Standardise advantages within each minibatch."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Widths of the actor and critic MLPs."""
    activation: Literal["tanh", "relu", "gelu", "silu"] = "tanh"
    """The MLPs' activation."""
    log_std_init: float = 0.0
    """Continuous actions: the Gaussian policy's initial log standard deviation."""
    state_dependent_std: bool = False
    """Continuous actions: the log-std is a head of the actor (else one learned vector)."""
    squash: bool = False
    """Continuous actions: map samples into the action bounds through tanh (with the
    log-probability's correction); else samples are clipped to the bounds for the env."""
    normalize_observations: bool = False
    """Normalise observations by running mean and variance (the same on every chip)."""
    scale_rewards: bool = False
    """Divide rewards by the running standard deviation of discounted returns."""
    network: Any = None
    """A flax module of your own instead of the MLPs: ``module(obs) -> (logits, value)``
    for discrete actions, ``((mean, log_std), value)`` for continuous ones."""

    def validate(self, batch_size: int) -> None:
        """Raise ``ValueError`` naming the first field that cannot work.

        Args:
            batch_size: env steps in one chip's batch (envs per chip x rollout length).
        """
        check_fields(self, {
            "learning_rate": "positive", "gamma": "unit", "gae_lambda": "unit",
            "clip_eps": "positive", "vf_coef": "non_negative", "ent_coef": "non_negative",
            "max_grad_norm": "positive", "num_epochs": "positive_int",
            "num_minibatches": "positive_int",
        })
        check_widths("hidden_sizes", self.hidden_sizes)
        check_choice("activation", self.activation, ACTIVATION_NAMES)
        check_minibatches(self.num_minibatches, batch_size)
