"""Episodes of a JAX environment as frames, and frames as an animated GIF for notebooks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.envs.base import JaxEnv


def episode_frames(
    env: str | JaxEnv,
    act_fn: Callable[[np.ndarray], Any],
    seed: int = 0,
    max_steps: int = 500,
) -> list[np.ndarray]:
    """Play one episode and draw every state, the start state included.

    Args:
        env: an environment id (see :func:`workbench.envs.jax_env_ids`) or a JAX environment.
        act_fn: the policy, ``act_fn(obs) -> action``, given each observation as a float32
            numpy array (an int, a numpy or a JAX scalar are all fine as a discrete action;
            an array of the env's action shape as a continuous one).
        seed: seeds the environment's PRNG key.
        max_steps: stop after this many steps even if the episode goes on.

    Returns:
        ``1 + steps`` uint8 RGB frames ``[H, W, 3]``.

    Raises:
        ValueError: an unknown environment id, ``max_steps < 1``, or an action out of range.
    """
    import jax

    from workbench.envs.gym_view import compiled
    from workbench.envs.registry import make_jax

    if max_steps < 1:
        raise ValueError(f"max_steps={max_steps} was asked; it must be at least 1.")
    env = make_jax(env) if isinstance(env, str) else env
    fns = compiled(env)
    key, state, obs = fns.reset(jax.random.key(seed))
    frames = [env.render(jax.device_get(state))]
    for _ in range(max_steps):
        action = np.asarray(act_fn(np.asarray(obs)))
        if env.num_actions:  # discrete; continuous envs (brax) have none
            action = int(action)
            if not 0 <= action < env.num_actions:
                raise ValueError(f"act_fn returned action {action}; {env.id} takes "
                                 f"0..{env.num_actions - 1}.")
            action = np.int32(action)
        else:
            action = action.astype(np.float32)
        key, state, obs, _, terminated, truncated = fns.step(key, state, action)
        frames.append(env.render(jax.device_get(state)))
        if bool(terminated) or bool(truncated):
            break
    return frames


def save_gif(frames: Sequence[np.ndarray], path: str | Path, fps: int = 30) -> Path:
    """Write frames as a looping animated GIF.

    In a notebook, show it with ``IPython.display.Image(filename=path)``. Pillow merges
    identical consecutive frames into one longer frame, so the file may hold fewer frames
    than given; the animation plays the same.

    Args:
        frames: uint8 RGB images ``[H, W, 3]``, all of one size.
        path: where to write the file.
        fps: frames per second; GIF timing is in hundredths of a second, so it is rounded.

    Returns:
        The path written.

    Raises:
        ValueError: no frames, frames of mixed sizes or not uint8 RGB, or ``fps <= 0``.
    """
    from PIL import Image

    if not frames:
        raise ValueError("save_gif got no frames; pass at least one [H, W, 3] uint8 image.")
    if fps <= 0:
        raise ValueError(f"fps={fps} was asked; it must be positive.")
    shape = np.asarray(frames[0]).shape
    for i, frame in enumerate(frames):
        frame = np.asarray(frame)
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
            raise ValueError(
                f"Frame {i} has shape {frame.shape} and dtype {frame.dtype}; every frame must "
                "be a uint8 RGB image [H, W, 3]."
            )
        if frame.shape != shape:
            raise ValueError(
                f"Frame {i} has shape {frame.shape} but frame 0 has {shape}; every frame must "
                "have the same size."
            )
    images = [Image.fromarray(np.asarray(frame)) for frame in frames]
    path = Path(path)
    images[0].save(
        path,
        format="GIF",
        save_all=True,
        append_images=images[1:],
        duration=max(10, round(100 / fps) * 10),
        loop=0,
    )
    return path
