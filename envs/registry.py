"""Which JAX environments exist, how to build one, their gymnasium registration, and the
return each one counts as solved.

Nothing here imports JAX: ``import workbench`` registers the gymnasium ids cheaply, and the
environment modules load on first use.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.envs.base import JaxEnv

_ID = re.compile(r"^[A-Za-z0-9_.\-/]+-v[0-9]+$")


@dataclass(frozen=True)
class JaxEnvEntry:
    """One registered JAX environment: how to build it, and what counts as solved.

    Picklable (Ray ships it to the learners, so an environment registered in a notebook
    cell reaches every chip)."""

    id: str
    factory: Any
    """``"module:Class"`` for the workbench's own, or any callable returning a JaxEnv."""
    reward_threshold: float | None = None
    """The mean return that counts as solved (the training target)."""
    kwargs: tuple[tuple[str, Any], ...] = ()
    """Environment parameters, passed to the factory."""

    def resolve(self) -> Callable[..., JaxEnv]:
        """The factory itself (imported, for the workbench's own environments)."""
        if isinstance(self.factory, str):
            module, name = self.factory.split(":")
            return getattr(importlib.import_module(module), name)
        return self.factory

    def make(self) -> JaxEnv:
        return self.resolve()(**dict(self.kwargs))

    def with_kwargs(self, **kwargs: Any) -> JaxEnvEntry:
        return dataclasses.replace(self, kwargs=tuple(sorted({**dict(self.kwargs),
                                                               **kwargs}.items())))


_ENTRIES: dict[str, JaxEnvEntry] = {
    e.id: e
    for e in (
        JaxEnvEntry("workbench/CartPole-v1", "workbench.envs.cartpole:CartPole", 475.0),
        # Catch and DeepSea pay at most 1.0 (0.99 on DeepSea's one rewarding path); their
        # targets are 90% of that, as bsuite's own reports read "solved".
        JaxEnvEntry("workbench/Catch-v0", "workbench.envs.catch:Catch", 0.9),
        JaxEnvEntry("workbench/DeepSea-v0", "workbench.envs.deepsea:DeepSea", 0.9),
    )
}

# Gymnasium registration details. CartPole declares its time limit so that tools reading
# `spec.max_episode_steps` see it; the env truncates by itself as well, at the same step.
_GYM_EXTRAS: dict[str, dict[str, Any]] = {
    "workbench/CartPole-v1": {"max_episode_steps": 500},
}


# The JAX suites reached by prefix: "gymnax:Breakout-MinAtar", "brax:inverted_pendulum".
SUITES: dict[str, tuple[str, tuple[tuple[str, Any], ...]]] = {
    "gymnax": ("workbench.envs.gymnax_family:GymnaxEnv", (("suite", "gymnax"),)),
    "craftax": ("workbench.envs.gymnax_family:GymnaxEnv", (("suite", "craftax"),)),
    "brax": ("workbench.envs.brax_env:BraxEnv", ()),
}
# What counts as solved for a suite's environment, where the suite says none: gymnax's
# classic-control and bsuite ports keep gymnasium's and bsuite's thresholds; brax's
# balancing tasks pay 1 a step for 1000 steps. Environments absent here have no target
# (MinAtar and Craftax publish scores, not a solved line).
SUITE_TARGETS: dict[str, float] = {
    "gymnax:CartPole-v1": 475.0,
    "gymnax:Acrobot-v1": -100.0,
    "gymnax:MountainCar-v0": -110.0,
    "gymnax:Catch-bsuite": 0.9,
    "gymnax:DeepSea-bsuite": 0.9,
    "brax:inverted_pendulum": 950.0,
    "brax:inverted_double_pendulum": 9000.0,
}


def _suite_entry(env_id: str) -> JaxEnvEntry | None:
    suite, _, name = env_id.partition(":")
    if suite not in SUITES or not name:
        return None
    factory, options = SUITES[suite]
    return JaxEnvEntry(env_id, factory, SUITE_TARGETS.get(env_id),
                       tuple(sorted((("name", name), *options))))


def jax_env_ids() -> list[str]:
    """The ids of every JAX environment (the workbench's and the user's), sorted.

    Returns:
        Ids such as ``"workbench/CartPole-v1"``, valid for :func:`make_jax` and for
        ``gymnasium.make``.
    """
    return sorted(_ENTRIES)


def jax_env_entry(env_id: str) -> JaxEnvEntry:
    """The registry entry of ``env_id``.

    Raises:
        ValueError: ``env_id`` is not a registered JAX environment, listing those there are.
    """
    if isinstance(env_id, str) and env_id not in _ENTRIES:
        entry = _suite_entry(env_id)
        if entry is not None:
            return entry
    if env_id not in _ENTRIES:
        hint = ""
        if isinstance(env_id, str) and f"workbench/{env_id}" in _ENTRIES:
            hint = f" Did you mean 'workbench/{env_id}'?"
        raise ValueError(
            f"No JAX environment {env_id!r}. Valid ids: {', '.join(jax_env_ids())}, and "
            f"those of the suites as {', '.join(s + ':<name>' for s in SUITES)} (e.g. "
            f"'gymnax:Breakout-MinAtar').{hint} Register your own with "
            "workbench.envs.register(id, factory); gymnasium's environments (e.g. "
            "'CartPole-v1') run through gymnasium.make."
        )
    return _ENTRIES[env_id]


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
    entry = jax_env_entry(env_id)
    if kwargs:
        factory = entry.resolve()
        if dataclasses.is_dataclass(factory):
            params = [f.name for f in dataclasses.fields(factory) if f.init]
            unknown = sorted(set(kwargs) - set(params))
            if unknown:
                raise ValueError(
                    f"{env_id} has no parameter {', '.join(unknown)}; its parameters are "
                    f"{', '.join(params) or 'none'}."
                )
        entry = entry.with_kwargs(**kwargs)
    return entry.make()


def register(
    env_id: str,
    factory: Callable[..., JaxEnv],
    *,
    reward_threshold: float | None = None,
    max_episode_steps: int | None = None,
    replace: bool = False,
) -> None:
    """Register a JAX environment of your own, for Anakin mode and as a gymnasium id.

    Args:
        env_id: ``namespace/Name-vN``, e.g. ``"mine/Corridor-v0"``.
        factory: a callable (usually the environment's class) returning an object that
            follows :class:`~workbench.envs.JaxEnv`, given the environment's parameters.
        reward_threshold: the mean return that counts as solved: the training target, and
            the line the dashboard draws.
        max_episode_steps: the time limit gymnasium's spec reports (the env truncates
            itself; this is only what tools read).
        replace: allow replacing an id registered earlier.

    Raises:
        ValueError: a malformed id, an id taken, a factory that is not callable, or a
            threshold that is not a finite number.
    """
    if not isinstance(env_id, str) or not _ID.fullmatch(env_id):
        raise ValueError(
            f"Environment id {env_id!r} must look like 'namespace/Name-v0' (letters, digits, "
            "'_', '-', '.', '/', ending in -v and a version)."
        )
    if env_id in _ENTRIES and not replace:
        raise ValueError(f"{env_id!r} is registered already; pass replace=True to replace it.")
    if not callable(factory):
        raise ValueError(f"factory must be callable (a class or a function), got {factory!r}.")
    if reward_threshold is not None and (
        isinstance(reward_threshold, bool) or not isinstance(reward_threshold, (int, float))
        or not math.isfinite(reward_threshold)
    ):
        raise ValueError(f"reward_threshold must be a finite number, got {reward_threshold!r}.")
    _ENTRIES[env_id] = JaxEnvEntry(env_id, factory, reward_threshold)
    if max_episode_steps is not None:
        _GYM_EXTRAS[env_id] = {"max_episode_steps": int(max_episode_steps)}
    _register_one(env_id, replace=replace)


def target_return(env_id: str) -> float | None:
    """The mean return that counts as solving ``env_id``: its JAX registry entry's, else
    gymnasium's ``spec.reward_threshold``; None when neither says."""
    if env_id in _ENTRIES:
        return _ENTRIES[env_id].reward_threshold
    if _suite_entry(env_id) is not None:
        return SUITE_TARGETS.get(env_id)
    from gymnasium.envs.registration import registry

    spec = registry.get(env_id)
    threshold = getattr(spec, "reward_threshold", None)
    return None if threshold is None else float(threshold)


def _register_one(env_id: str, replace: bool = False) -> None:
    from gymnasium.envs.registration import register as gym_register
    from gymnasium.envs.registration import registry

    if env_id in registry:
        if not replace:
            return
        del registry[env_id]
    gym_register(
        id=env_id,
        entry_point="workbench.envs.gym_view:JaxGymEnv",
        vector_entry_point="workbench.envs.gym_view:JaxVectorEnv",
        # A user's environment: its entry rides in the spec (see gym_view._jax_env).
        kwargs={"env_id": env_id, **({"entry": _ENTRIES[env_id]}
                                     if not env_id.startswith("workbench/") else {})},
        reward_threshold=_ENTRIES[env_id].reward_threshold,
        **_GYM_EXTRAS.get(env_id, {}),
    )


def register_gymnasium() -> None:
    """Register every JAX environment with gymnasium, under the same ids.

    Idempotent: ids that gymnasium already knows are left alone.
    """
    for env_id in jax_env_ids():
        _register_one(env_id)
