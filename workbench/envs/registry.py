"""Which JAX environments exist, how to build one, and their gymnasium registration.

Nothing here imports JAX: ``import workbench`` registers the gymnasium ids cheaply, and the
environment modules load on first use.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from workbench.envs.base import JaxEnv

_CLASSES: dict[str, str] = {
    "workbench/CartPole-v1": "workbench.envs.cartpole:CartPole",
    "workbench/Catch-v0": "workbench.envs.catch:Catch",
    "workbench/DeepSea-v0": "workbench.envs.deepsea:DeepSea",
}

# Extra gymnasium registration details. CartPole declares its time limit so that tools that
# read `spec.max_episode_steps` see it; the env truncates by itself as well, at the same step.
_GYM_EXTRAS: dict[str, dict[str, Any]] = {
    "workbench/CartPole-v1": {"max_episode_steps": 500, "reward_threshold": 475.0},
}


def jax_env_ids() -> list[str]:
    """The ids of every JAX environment, sorted.

    Returns:
        Ids such as ``"workbench/CartPole-v1"``, valid for :func:`make_jax` and for
        ``gymnasium.make``.
    """
    return sorted(_CLASSES)


def jax_env_class(env_id: str) -> type:
    """The class of the environment ``env_id``.

    Args:
        env_id: one of :func:`jax_env_ids`.

    Returns:
        The environment's dataclass.

    Raises:
        ValueError: ``env_id`` is not a JAX environment of the workbench.
    """
    if env_id not in _CLASSES:
        hint = ""
        if f"workbench/{env_id}" in _CLASSES:
            hint = f" Did you mean 'workbench/{env_id}'?"
        raise ValueError(
            f"No JAX environment {env_id!r}. Valid ids: {', '.join(jax_env_ids())}.{hint} "
            "Gymnasium's own environments (e.g. 'CartPole-v1') run through gymnasium.make."
        )
    module, name = _CLASSES[env_id].split(":")
    return getattr(importlib.import_module(module), name)


def make_jax(env_id: str, **kwargs: Any) -> JaxEnv:
    """Build the JAX environment ``env_id``.

    Args:
        env_id: one of :func:`jax_env_ids`.
        **kwargs: the environment's own parameters, e.g. ``size=20`` for DeepSea.

    Returns:
        The environment: a frozen, hashable value with pure ``reset`` and ``step``.

    Raises:
        ValueError: an unknown id, an unknown parameter, or a bad parameter value.
    """
    cls = jax_env_class(env_id)
    params = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        raise ValueError(
            f"{env_id} has no parameter {', '.join(unknown)}; its parameters are "
            f"{', '.join(params) or 'none'}."
        )
    return cls(**kwargs)


def register_gymnasium() -> None:
    """Register every JAX environment with gymnasium, under the same ids.

    Idempotent: ids that gymnasium already knows are left alone.
    """
    from gymnasium.envs.registration import register, registry

    for env_id in jax_env_ids():
        if env_id in registry:
            continue
        register(
            id=env_id,
            entry_point="workbench.envs.gym_view:JaxGymEnv",
            vector_entry_point="workbench.envs.gym_view:JaxVectorEnv",
            kwargs={"env_id": env_id},
            **_GYM_EXTRAS.get(env_id, {}),
        )
