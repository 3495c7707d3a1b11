"""One key tree per run: the seed is split once into named keys, and every random choice
of the run (initial parameters, each env batch, each update, the evaluations) derives from
one of them by ``fold_in`` with its index. Same seed, same slice shape: same run."""

from __future__ import annotations

from typing import Any, NamedTuple


class RunKeys(NamedTuple):
    params: Any
    """The learner state's initialisation."""
    envs: Any
    """Environments: folded with an env batch's index (a rollout actor, or a chip's JAX envs)."""
    updates: Any
    """Updates: folded with the update's number (shuffling, sampling inside the update)."""
    evaluation: Any
    """Greedy evaluations' start states."""


def run_keys(seed: int) -> RunKeys:
    """The run's named keys, split once from ``seed``."""
    import jax

    return RunKeys(*jax.random.split(jax.random.PRNGKey(seed), 4))


def update_key(keys: RunKeys, update: int):
    """The key of update ``update`` (the same on every chip)."""
    import jax

    return jax.random.fold_in(keys.updates, update)


def env_key(keys: RunKeys, index: int):
    """The key of env batch ``index``."""
    import jax

    return jax.random.fold_in(keys.envs, index)


def as_seed(key) -> int:
    """A non-negative int seed from a key, for libraries that take ints (gymnasium)."""
    import jax
    import numpy as np

    data = np.asarray(jax.random.key_data(key), dtype=np.uint32).ravel()
    return int(data[0]) << 31 ^ int(data[-1]) >> 1
