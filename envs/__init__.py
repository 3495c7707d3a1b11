"""The workbench's environments: pure JAX environments for on-chip training, each also
registered with gymnasium under the same id; and the registry a user's own JAX
environment joins.

``make_jax(id)`` gives the JAX environment (see :class:`JaxEnv` for the contract);
``gymnasium.make(id)`` and ``gymnasium.make_vec(id, n)`` give gymnasium views of it;
``register(id, factory)`` adds one. Importing this package (``import workbench`` does)
registers the ids with gymnasium; it does not import JAX.

This folder sits at the top of the repository and installs as ``workbench.envs``.
"""

from workbench.envs.animation import episode_frames, save_gif
from workbench.envs.base import JaxEnv
from workbench.envs.registry import (
    JaxEnvEntry,
    jax_env_entry,
    jax_env_ids,
    make_jax,
    register,
    register_gymnasium,
    target_return,
)

# gymnasium 1.x dropped plugin entry points, so registering on import is the way in.
register_gymnasium()

__all__ = [
    "JaxEnv",
    "JaxEnvEntry",
    "episode_frames",
    "jax_env_entry",
    "jax_env_ids",
    "make_jax",
    "register",
    "save_gif",
    "target_return",
]
