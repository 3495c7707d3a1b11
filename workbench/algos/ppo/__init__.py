"""PPO (clipped surrogate, GAE) for discrete and continuous actions, as a plug-in of the
algorithm protocol.

The record and the config load without JAX; the math (:mod:`workbench.algos.ppo.agent`)
loads when an agent is built, and its names are importable from here too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from workbench.algos.base import CONTINUOUS, DISCRETE, Algorithm, Spaces
from workbench.algos.ppo.config import PPOConfig

_AGENT_NAMES = ("Batch", "LossFn", "PPOState", "Policy", "flatten", "gae", "make_act",
                "make_greedy", "make_optimizer", "make_policy", "make_update", "masked_mean",
                "ppo_loss")


def build(config: PPOConfig, spaces: Spaces, num_updates: int, loss_fn: Any = None):
    """PPO's :class:`~workbench.algos.base.Agent` (see :func:`workbench.algos.ppo.agent.build`)."""
    from workbench.algos.ppo import agent

    return agent.build(config, spaces, num_updates, loss_fn or agent.ppo_loss)


PPO = Algorithm(
    name="ppo",
    config_type=PPOConfig,
    build=build,
    action_kinds=(DISCRETE, CONTINUOUS),
    summary="PPO with a clipped surrogate and GAE (discrete or Gaussian policies)",
)


def with_loss(loss_fn, name: str | None = None) -> Algorithm:
    """PPO with your own loss: ``loss_fn(params, apply_fn, batch, config) -> (loss,
    metrics)``, everything else as PPO. Register the result to train it by name.

    Args:
        loss_fn: a pure function (one defined in a notebook cell works).
        name: the algorithm's name; the function's name by default.
    """
    return dataclasses.replace(
        PPO,
        name=name or loss_fn.__name__,
        build=lambda config, spaces, num_updates: build(config, spaces, num_updates, loss_fn),
        summary=f"PPO with the loss {loss_fn.__name__}",
    )


def __getattr__(name: str):
    if name in _AGENT_NAMES:
        from workbench.algos.ppo import agent

        return getattr(agent, name)
    raise AttributeError(f"module 'workbench.algos.ppo' has no attribute {name!r}")


__all__ = ["PPO", "PPOConfig", "build", "with_loss", *_AGENT_NAMES]
