"""PPO's hyperparameters: a plain dataclass, importable without JAX (the command line and
config files read it before anything heavy loads)."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.algos.base import check_fields


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
        sizes = self.hidden_sizes
        if (not isinstance(sizes, tuple) or not sizes
                or not all(isinstance(w, int) and not isinstance(w, bool) and w > 0
                           for w in sizes)):
            raise ValueError(
                f"hidden_sizes must be a non-empty tuple of positive widths such as (64, 64), "
                f"got {sizes!r}."
            )
        if batch_size < self.num_minibatches:
            raise ValueError(
                f"num_minibatches={self.num_minibatches} does not fit a batch of "
                f"{batch_size} env steps per chip (envs_per_chip x rollout_length): use at "
                f"most {batch_size} minibatches, or more envs or a longer rollout."
            )
