"""A trained policy read back from a run's checkpoints, outside the run that trained it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.engine.checkpoint import META, CheckpointError, restore, steps


@dataclass
class LoadedPolicy:
    """A checkpoint's policy with what it needs to act: its algorithm, config and spaces."""

    path: str
    """The step folder it was read from."""
    update: int
    env_steps: int
    meta: dict
    """The run's identity as the checkpoint recorded it (env, algo, seed, slice...)."""
    algo_config: Any
    spaces: Any
    params: Any
    """The policy (numpy), as rollouts and evaluations get it."""
    agent: Any = dataclasses.field(repr=False, default=None)

    @property
    def env(self) -> str:
        return self.meta["env"]

    def greedy_policy(self) -> Callable[[Any], Any]:
        """``act(obs) -> action`` for one observation, with the greedy policy (jitted)."""
        import jax

        greedy, params = self.agent.build().greedy, self.params
        one = jax.jit(lambda obs: greedy(params, obs[None])[0])
        return lambda obs: one(obs)


def checkpoint_dir_of(path: str | Path) -> tuple[str, int | None]:
    """The checkpoint directory (and step, if a step folder was named) behind ``path``:
    a run's folder, its ``checkpoints/``, or one numbered step of it."""
    path = Path(path)
    if (path / META).is_file() and path.name.isdigit():
        return str(path.parent), int(path.name)
    if (path / "run.json").is_file():
        import json

        recorded = json.loads((path / "run.json").read_text()).get("checkpoint_dir")
        return str(recorded or path / "checkpoints"), None
    return str(path), None


def load(path: str | Path, step: int | None = None) -> LoadedPolicy:
    """The trained policy of a run, from its folder, its checkpoint directory or a step.

    Args:
        path: a run's folder (``TrainResult.run_dir``), its ``checkpoints/`` or a step.
        step: a checkpoint step; the newest that checks out by default.

    Returns:
        The policy and its config; ``greedy_policy()`` gives ``act(obs) -> action``.

    Raises:
        CheckpointError: nothing usable there, or its algorithm is not registered here.
    """
    import jax

    import workbench.algos as algos
    from workbench.algos.base import Spaces
    from workbench.engine.fields import from_mapping
    from workbench.learn.learner import AgentSpec

    directory, named_step = checkpoint_dir_of(path)
    if not steps(directory):
        why = "it does not exist" if not Path(path).exists() else "no checkpoint steps in it"
        raise CheckpointError(
            f"{str(path)!r} holds no checkpoint ({why}). Pass a trained run's folder "
            "(TrainResult.run_dir, which workbench train prints), its checkpoints/ folder, "
            "or one numbered step of it.")
    restored = restore(directory, step if step is not None else named_step)
    meta = restored.meta
    try:
        algorithm = algos.get(meta["algo"])
    except ValueError as error:
        raise CheckpointError(
            f"{restored.path} was trained with algorithm {meta['algo']!r}, which this "
            f"process does not know ({error}); register it first."
        ) from None
    hyperparameters = from_mapping(algorithm.config_type, meta["algo_config"],
                                   f"{algorithm.name}'s config")
    spaces = Spaces(**{k: tuple(v) if isinstance(v, list) else v
                       for k, v in meta["spaces"].items()})
    agent = AgentSpec(algorithm, hyperparameters, spaces, num_updates=1)
    built = agent.build()
    template = jax.eval_shape(built.init, jax.random.PRNGKey(0))
    treedef = jax.tree.structure(template)
    if treedef.num_leaves != len(restored.state):
        raise CheckpointError(
            f"{restored.path} holds {len(restored.state)} arrays, but {algorithm.name} with "
            f"this config builds a state of {treedef.num_leaves}."
        )
    state = jax.tree.unflatten(treedef, restored.state)
    params = jax.tree.map(lambda x: jax.device_get(x), built.policy(state))
    return LoadedPolicy(restored.path, restored.update, restored.env_steps, meta,
                        hyperparameters, spaces, params, agent)
