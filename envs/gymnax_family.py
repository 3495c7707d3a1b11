"""gymnax's environments (classic control, MinAtar, bsuite, misc) and Craftax, which keeps
gymnax's interface, behind the workbench's JAX environment contract.

The adapter calls the suites' own ``reset_env``/``step_env``, which do not reset by
themselves (the workbench's rollouts reset on the next step, as gymnasium's vector envs
do), and tells termination from a time limit: gymnax 1.x reports the two apart; Craftax's
``done`` includes its time limit, read back from its state's step counter.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def _import(module: str, extra: str = "envs"):
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ValueError(
            f"{module.split('.')[0]} is not installed ({error}). Install the environment "
            f"suites with: pip install 'tpu-rl-workbench[{extra}]'"
        ) from None


@dataclass(frozen=True)
class GymnaxEnv:
    """One environment of gymnax (``suite="gymnax"``) or Craftax (``suite="craftax"``)."""

    name: str
    suite: str = "gymnax"
    _env: Any = field(default=None, compare=False, hash=False, repr=False)
    _params: Any = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if self.suite == "gymnax":
            gymnax = _import("gymnax")
            try:
                env, params = gymnax.make(self.name)
            except (ValueError, KeyError) as error:
                raise ValueError(f"gymnax has no environment {self.name!r} ({error}); its ids: "
                                 f"{', '.join(gymnax.registered_envs)}.") from None
        elif self.suite == "craftax":
            craftax_env = _import("craftax.craftax_env")
            try:
                env = craftax_env.make_craftax_env_from_name(self.name, auto_reset=False)
            except (ValueError, KeyError) as error:
                raise ValueError(f"Craftax has no environment {self.name!r} ({error}).") from None
            params = env.default_params
        else:
            raise ValueError(f"unknown gymnax-like suite {self.suite!r}")
        object.__setattr__(self, "_env", env)
        object.__setattr__(self, "_params", params)

    # ---- the contract ------------------------------------------------------------------

    @property
    def id(self) -> str:
        return f"{self.suite}:{self.name}"

    @property
    def observation_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self._env.observation_space(self._params).shape)

    @property
    def num_actions(self) -> int:
        space = self._env.action_space(self._params)
        return int(getattr(space, "n", 0) or getattr(space, "num_categories", 0))

    @property
    def action_shape(self) -> tuple[int, ...] | None:
        """The shape of a continuous action, or None for discrete actions."""
        space = self._env.action_space(self._params)
        if hasattr(space, "n") or hasattr(space, "num_categories"):
            return None
        return tuple(int(d) for d in space.shape) or (1,)

    @property
    def action_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        space = self._env.action_space(self._params)
        shape = self.action_shape or ()
        return (np.broadcast_to(np.asarray(space.low, np.float32), shape),
                np.broadcast_to(np.asarray(space.high, np.float32), shape))

    @property
    def max_episode_steps(self) -> int:
        params = self._params
        return int(getattr(params, "max_steps_in_episode", 0)
                   or getattr(params, "max_timesteps", 0))

    def reset(self, key):
        import jax.numpy as jnp

        obs, state = self._env.reset_env(key, self._params)
        return state, jnp.asarray(obs, jnp.float32)

    def step(self, state, action, key):
        import jax.numpy as jnp

        if self.action_shape is not None and self.action_shape == (1,) and \
                getattr(self._env.action_space(self._params), "shape", (1,)) == ():
            action = action.reshape(())
        obs, state, reward, ended, _ = self._env.step_env(key, state, action, self._params)
        if self.suite == "gymnax":
            # gymnax 1.x: step_env's flag is termination; the time limit is reported apart.
            terminated = ended
            truncated = self._env.is_truncated(state, self._params) & ~terminated
        else:
            truncated = state.timestep >= self._params.max_timesteps
            terminated = ended & ~truncated
        return (state, jnp.asarray(obs, jnp.float32), jnp.asarray(reward, jnp.float32),
                jnp.asarray(terminated, bool), jnp.asarray(truncated, bool))

    def render(self, state) -> np.ndarray:
        """The observation as a picture: a grid's channels in colours, a vector as bars."""
        obs = np.asarray(self._env.get_obs(state, self._params)
                         if self.suite == "gymnax" else self._env.get_obs(state), np.float32)
        return picture_of(obs)

    def with_options(self, **kwargs: Any) -> GymnaxEnv:
        return dataclasses.replace(self, **kwargs)


def picture_of(obs: np.ndarray, size: int = 160) -> np.ndarray:
    """An RGB picture of an observation: each channel of an ``[H, W, C]`` grid in its own
    colour, a vector as bars around a middle line."""
    from PIL import Image

    if obs.ndim == 3:
        colours = np.array([[230, 60, 60], [60, 160, 230], [250, 200, 40], [90, 200, 90],
                            [180, 90, 220], [240, 140, 60], [120, 120, 120], [40, 40, 40],
                            [200, 200, 200], [20, 120, 120]], np.float32)
        grid = np.full(obs.shape[:2] + (3,), 255.0, np.float32)
        for c in range(obs.shape[2]):
            on = obs[..., c] > 0
            grid[on] = colours[c % len(colours)]
        image = Image.fromarray(grid.astype(np.uint8)).resize((size, size), Image.NEAREST)
    else:
        values = obs.ravel()
        scale = max(1e-6, float(np.abs(values).max()))
        bars = np.full((size // 2, max(1, len(values)) * 8, 3), 255, np.uint8)
        middle = bars.shape[0] // 2
        for i, v in enumerate(values):
            height = int(abs(v) / scale * (middle - 1))
            top, bottom = (middle - height, middle) if v >= 0 else (middle, middle + height)
            bars[top:bottom, i * 8:i * 8 + 6] = (60, 120, 200)
        image = Image.fromarray(bars)
    return np.asarray(image.convert("RGB"), np.uint8)
