"""The workbench's own environments: pure JAX environments for on-chip training, each also
registered with gymnasium under the same id.

``make_jax(id)`` gives the JAX environment (see :class:`JaxEnv` for the contract);
``gymnasium.make(id)`` and ``gymnasium.make_vec(id, n)`` give gymnasium views of it. Importing
this package (``import workbench`` does) registers the ids; it does not import JAX.
"""

from workbench.envs.animation import episode_frames, save_gif
from workbench.envs.base import JaxEnv
from workbench.envs.registry import jax_env_ids, make_jax, register_gymnasium

# gymnasium 1.x dropped plugin entry points, so registering on import is the way in.
register_gymnasium()

__all__ = ["JaxEnv", "episode_frames", "jax_env_ids", "make_jax", "save_gif"]
