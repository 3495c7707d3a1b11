"""brax's environments behind the workbench's JAX environment contract: continuous actions
in [-1, 1], episodes cut at ``episode_length`` steps (brax's own training wrapper does the
same), no resets inside ``step``."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from workbench.envs.gymnax_family import _import


@contextlib.contextmanager
def _local_device_first():
    """Let ``jax.devices()[0]`` be this process's own device while brax builds its system.

    NOTE: MuJoCo's ``mjx.put_model``, which brax's loader calls without a device, puts the
    model on ``jax.devices()[0]``: in a slice's ``jax.distributed`` group that is rank 0's
    chip, which the other ranks cannot address, and their compile then fails on a closed-
    over array ("spans non-addressable devices"). Nothing else runs JAX in a learner while
    its environment is built.
    """
    import jax

    devices = jax.devices
    local = jax.local_devices()

    def local_first(*args, **kwargs):
        found = devices(*args, **kwargs)
        return [d for d in found if d in local] + [d for d in found if d not in local]

    jax.devices = local_first
    try:
        yield
    finally:
        jax.devices = devices


class BraxState(NamedTuple):
    inner: Any
    t: Any
    """Steps taken in this episode."""


@dataclass(frozen=True)
class BraxEnv:
    """One brax environment (``brax.envs.get_environment(name, backend=backend)``)."""

    name: str
    episode_length: int = 1000
    backend: str = "generalized"
    _env: Any = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        envs = _import("brax.envs")
        if self.name not in envs._envs:
            raise ValueError(f"brax has no environment {self.name!r}; its ids: "
                             f"{', '.join(sorted(envs._envs))}.")
        if not isinstance(self.episode_length, int) or self.episode_length < 1:
            raise ValueError(f"episode_length must be a positive whole number, got "
                             f"{self.episode_length!r}.")
        with _local_device_first():
            env = envs.get_environment(self.name, backend=self.backend)
        object.__setattr__(self, "_env", env)

    @property
    def id(self) -> str:
        return f"brax:{self.name}"

    @functools.cached_property
    def observation_shape(self) -> tuple[int, ...]:
        import jax

        # brax's own observation_size runs a reset op by op, compiling each of its hundreds
        # of operations (12 s for inverted_pendulum on two cores); its shape needs no values.
        reset = jax.eval_shape(self._env.reset, jax.random.PRNGKey(0))
        return tuple(int(d) for d in reset.obs.shape[-1:])

    num_actions = 0

    chip_typed = False
    """brax's constraint solver (jaxopt) has a ``cond`` whose branches JAX's per-chip
    typing in ``shard_map`` rejects (see ``workbench.envs.base``)."""

    @property
    def action_shape(self) -> tuple[int, ...]:
        return (int(self._env.action_size),)

    @property
    def action_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return (-np.ones(self.action_shape, np.float32), np.ones(self.action_shape, np.float32))

    @property
    def max_episode_steps(self) -> int:
        return self.episode_length

    def reset(self, key):
        import jax.numpy as jnp

        inner = self._env.reset(key)
        return BraxState(inner, jnp.zeros((), jnp.int32)), inner.obs.astype(jnp.float32)

    def step(self, state: BraxState, action, key):
        import jax.numpy as jnp

        del key  # brax's dynamics are deterministic given the state
        inner = self._env.step(state.inner, action)
        # Some brax envs set a constant reward (inverted_pendulum: 1.0) as a Python float;
        # the state then has to keep reset's array types to stay a scan carry.
        inner = inner.replace(reward=jnp.asarray(inner.reward, jnp.float32),
                              done=jnp.asarray(inner.done, jnp.float32))
        t = state.t + 1
        terminated = inner.done > 0
        truncated = (t >= self.episode_length) & ~terminated
        return BraxState(inner, t), inner.obs.astype(jnp.float32), inner.reward, terminated, \
            truncated

    def render(self, state) -> np.ndarray:
        from workbench.envs.gymnax_family import picture_of

        return picture_of(np.asarray(state.inner.obs, np.float32))
