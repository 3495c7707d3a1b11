"""Everything about a run that can be decided on the driver before anything starts: the
algorithm and its hyperparameters, the environment's spaces, the target, and whether the
slice can carry the layout. A run that cannot work is refused here, naming why."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workbench.algos.base import CONTINUOUS, DISCRETE, Algorithm, Spaces
from workbench.engine.config import TrainConfig
from workbench.engine.fields import ConfigError
from workbench.learn.learner import AgentSpec, LearnerSetup
from workbench.learn.modes import learner_class


@dataclass(frozen=True)
class RunPlan:
    """A validated run, ready to be laid out on a slice."""

    config: TrainConfig
    algorithm: Algorithm
    hyperparameters: Any
    spaces: Spaces
    target_return: float | None
    host_rollouts: bool
    """Whether rollout actors run on the hosts' CPUs (actors mode)."""
    jax_env: Any = None
    """The JAX environment's registry entry: what Anakin learners step, or what the
    evaluator runs as one program when a gymnasium id is a JAX env's view."""
    env_ref: Any = None
    """The gymnasium env's spec, with ``env_kwargs`` (actors mode): what rollout actors
    make their envs from, so an env registered only on the driver reaches them too."""
    run_dir: str = ""
    """The run's folder (absolute)."""
    checkpoint_dir: str = ""
    """Where its checkpoints go (absolute, or a bucket URL)."""
    identity: dict = dataclasses.field(default_factory=dict)
    """What a checkpoint records of the run, and what a resume must match."""
    resume_from: dict | None = None
    """The identity of the checkpoint being continued (resumes only)."""

    def agent(self, num_chips: int) -> AgentSpec:
        return AgentSpec(self.algorithm, self.hyperparameters, self.spaces,
                         self.config.num_updates(num_chips))

    def rollout_actors_per_host(self, tpu_slice) -> int:
        """The config's ``rollout_actors_per_host``, or with 0 the count
        :func:`auto_rollout_actors` picks for ``tpu_slice``; 0 in a mode without host
        rollouts."""
        if not self.host_rollouts:
            return 0
        if self.config.rollout_actors_per_host:
            return self.config.rollout_actors_per_host
        shape = tpu_slice.shape
        return auto_rollout_actors(
            shape.chips_per_host, tpu_slice.cpus_per_chip,
            vectorised=steps_vectorised(self.env_ref, self.config.wrappers),
            machine_cpus=_machine_cpus(tpu_slice),
        )

    def learner_setup(self, num_chips: int, sync: str) -> LearnerSetup:
        config = self.config
        return LearnerSetup(
            agent=self.agent(num_chips),
            seed=config.seed,
            sync=sync,
            envs_per_chip=config.envs_per_chip,
            rollout_length=config.rollout_length,
            jax_env=self.jax_env.make if self.jax_env is not None else None,
            policy_lag=config.policy_lag,
        )


def plan_run(config: TrainConfig) -> RunPlan:
    """Validate ``config`` and resolve what the run needs.

    Raises:
        ValueError: a field that cannot work, an unknown or unsupported environment, or an
            algorithm that cannot learn it; nothing has been started.
    """
    config.validate()
    learner = learner_class(config.mode)
    env_ref = None
    if learner.env_kind == "jax":
        entry = _jax_env_entry(config.env, config.env_kwargs)
        spaces = jax_env_spaces(entry.make())
    else:
        env_ref = _gymnasium_spec(config.env, config.env_kwargs)
        spaces = _gymnasium_spaces(env_ref, config.wrappers)
        entry = _jax_view(config.env) if not config.env_kwargs and not config.wrappers \
            else None
    target = _target(config)
    algorithm = config.algorithm()
    hyperparameters = config.hyperparameters()
    algorithm.check(hyperparameters, spaces, config.env, config.steps_per_update)
    run_dir, checkpoint_dir = _directories(config)
    identity = {
        "run_id": Path(run_dir).name,
        "env": config.env,
        "algo": algorithm.name,
        "algo_config": _as_record(hyperparameters),
        "spaces": dataclasses.asdict(spaces),
        "mode": config.mode,
        "seed": config.seed,
        "total_env_steps": config.total_env_steps,
    }
    resume_from = _check_checkpoints(config, checkpoint_dir, identity)
    return RunPlan(config, algorithm, hyperparameters, spaces, target, learner.host_rollouts,
                   entry, env_ref, run_dir, checkpoint_dir, identity, resume_from)


def runs_root() -> Path:
    """Where runs get their folders by default: ``$WORKBENCH_RUNS``, else ``./runs``."""
    return Path(os.environ.get("WORKBENCH_RUNS") or "runs").absolute()


def _directories(config: TrainConfig) -> tuple[str, str]:
    from workbench.engine.checkpoint import is_remote

    if config.run_dir:
        run_dir = config.run_dir if is_remote(config.run_dir) else \
            str(Path(config.run_dir).absolute())
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        env = re.sub(r"[^A-Za-z0-9]+", "-", config.env).strip("-")
        name = f"{stamp}-{env}-{config.algo}-s{config.seed}-{uuid.uuid4().hex[:6]}"
        run_dir = str(runs_root() / name)
    if config.checkpoint_dir:
        checkpoint_dir = config.checkpoint_dir if is_remote(config.checkpoint_dir) else \
            str(Path(config.checkpoint_dir).absolute())
    else:
        checkpoint_dir = f"{run_dir.rstrip('/')}/checkpoints"
    return run_dir, checkpoint_dir


def _as_record(config: Any) -> Any:
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else repr(config)


def _check_checkpoints(config: TrainConfig, checkpoint_dir: str, identity: dict) -> dict | None:
    """A resume must continue a compatible run; a fresh run must not write over one.
    Returns the identity of the checkpoint a resume continues."""
    import workbench.engine.checkpoint as checkpoint

    if checkpoint.is_remote(checkpoint_dir):
        return None  # checked by the learner that reads it
    if not config.resume:
        if Path(checkpoint_dir).is_dir():
            checkpoint.check_fresh(checkpoint_dir)
        return None
    checkpoint.require_checkpoint(checkpoint_dir)
    meta = checkpoint.latest_meta(checkpoint_dir)
    if meta is None:
        raise checkpoint.CheckpointError(
            f"{checkpoint_dir!r} holds no checkpoint with its {checkpoint.META} (written by "
            "an older workbench, or damaged): start fresh in another checkpoint_dir."
        )
    checkpoint.check_compatible(meta, identity, checkpoint_dir)
    return meta


def auto_rollout_actors(chips_per_host: int, cpus_per_chip: int, *, vectorised: bool,
                        machine_cpus: int | None = None) -> int:
    """Rollout actors per host when the config leaves the count to the workbench.

    An env with a vectorised implementation steps every chip's envs in one array call, so
    one actor per host, with one policy forward per step for all its chips, is fastest.
    One stepped env by env in Python is bound by one CPU per actor, so it gets as many
    actors as the reservation has CPUs for beside the learners: one per chip whose bundle
    has a CPU to spare (an actor sits in the bundle of the first chip it feeds), at most
    ``machine_cpus`` per host (the cores a simulated slice's hosts really share), and
    always a divisor of the host's chips (each actor feeds an equal share).
    """
    if vectorised or cpus_per_chip < 2:
        return 1
    limit = chips_per_host if machine_cpus is None else min(chips_per_host, machine_cpus)
    return max(n for n in range(1, chips_per_host + 1)
               if chips_per_host % n == 0 and n <= max(1, limit))


def steps_vectorised(env_ref, wrappers: tuple) -> bool:
    """Whether rollout actors step ``env_ref`` through its own vectorised implementation
    (as :func:`workbench.learn.rollout.make_vector_env` does when no wrapper is asked for)."""
    return not wrappers and getattr(env_ref, "vector_entry_point", None) is not None


def _machine_cpus(tpu_slice) -> int | None:
    """Cores left to each host's rollout actors when the slice's hosts all run on this
    machine (a simulated slice): its cores less one per chip's learner, split over the
    hosts. None on a cluster elsewhere, whose hosts' CPUs are the reservation's."""
    from workbench.tpu.cluster import connection

    current = connection()
    if current is None or not current.on_this_machine:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, ((cores or 1) - tpu_slice.num_chips) // tpu_slice.num_hosts)


def slice_record(tpu_slice) -> dict:
    shape = tpu_slice.shape
    return {"generation": shape.generation.name, "topology": shape.topology,
            "chips": shape.chips}


def check_slice(plan: RunPlan, tpu_slice) -> None:
    """Refuse a layout the reserved slice cannot carry.

    Raises:
        ValueError: a released slice, a rollout-actor count that does not divide a host's
            chips, or too few CPUs per chip for a learner and a rollout actor.
    """
    config = plan.config
    if tpu_slice.released:
        raise ValueError("This slice has been released; reserve a slice and train on that.")
    if plan.resume_from is not None:
        from workbench.engine.checkpoint import slice_note

        note = slice_note(plan.resume_from, slice_record(tpu_slice))
        if note:
            import logging

            logging.getLogger(__name__).warning("resuming: %s", note)
    if not plan.host_rollouts:
        return
    chips_per_host = tpu_slice.shape.chips_per_host
    if config.rollout_actors_per_host and chips_per_host % config.rollout_actors_per_host:
        raise ConfigError(
            "rollout_actors_per_host",
            f"={config.rollout_actors_per_host} does not divide the {chips_per_host} chips "
            f"of a {tpu_slice.shape.label} host; use a divisor of {chips_per_host}.",
        )
    if tpu_slice.cpus_per_chip < 2:
        raise ValueError(
            f"Each chip's bundle has {tpu_slice.cpus_per_chip} CPU(s); a learner and a "
            "rollout actor placed beside it need 2: reserve with cpus_per_chip=2."
        )


def _target(config: TrainConfig) -> float | None:
    from workbench.envs import target_return

    target = config.target_return
    if target is None:
        target = target_return(_registered_id(config.env))
    if target is None and config.stop_at_target:
        raise ConfigError(
            "stop_at_target",
            f"needs a target, and {config.env} has no reward_threshold: set target_return "
            "(--target-return) to the mean return that counts as solved.",
        )
    return target


def _registered_id(env_id: str) -> str:
    return env_id.split(":", 1)[1] if ":" in env_id else env_id


def jax_env_spaces(env) -> Spaces:
    """The spaces of a JAX environment: continuous when it has an ``action_shape``."""
    shape = getattr(env, "action_shape", None)
    obs = tuple(int(d) for d in env.observation_shape)
    if shape:
        low, high = env.action_bounds
        return Spaces(obs, CONTINUOUS, action_shape=tuple(int(d) for d in shape),
                      action_low=tuple(float(x) for x in np.ravel(low)),
                      action_high=tuple(float(x) for x in np.ravel(high)))
    return Spaces(obs, DISCRETE, num_actions=int(env.num_actions))


def _jax_env_entry(env_id: str, env_kwargs: dict):
    from workbench.envs import jax_env_entry, jax_env_ids

    try:
        entry = jax_env_entry(env_id)
        if env_kwargs:
            entry = entry.with_kwargs(**env_kwargs)
        entry.make()  # a suite that is not installed, or an unknown name, says so here
        return entry
    except ValueError:
        if ":" in env_id and env_id.split(":")[0] in ("gymnax", "craftax", "brax"):
            raise
        raise ValueError(
            f"Anakin mode steps JAX environments on the chip, and {env_id!r} is not one. "
            f"JAX environments: {', '.join(jax_env_ids())}. Use one of them (or register "
            "yours with workbench.envs.register), or mode='actors' for any gymnasium "
            "environment, or a suite's as 'gymnax:<name>', 'brax:<name>' or "
            "'craftax:<name>'."
        ) from None


def _jax_view(env_id: str):
    """The JAX env behind a gymnasium id, when the id is one of the JAX envs' views."""
    from workbench.envs import jax_env_entry, jax_env_ids

    return jax_env_entry(env_id) if env_id in jax_env_ids() else None


def _gymnasium_spec(env_id: str, env_kwargs: dict):
    """The registered spec of ``env_id`` (``module:Id`` imports the module first), with
    ``env_kwargs`` over its own keyword arguments.

    Raises:
        ValueError: the module cannot be imported, or the id is not registered.
    """
    import copy

    import gymnasium as gym

    module, _, name = env_id.rpartition(":")
    from workbench.envs.registry import SUITES

    if module in SUITES:
        # "gymnax:CartPole-v1" names gymnax's JAX env; without this the gymnasium env of
        # the same name would train instead, once the suite's module imported.
        raise ValueError(f"Environment {env_id!r} is a JAX environment of {module}: it "
                         "trains in mode='anakin' (the actors mode steps gymnasium ids "
                         f"such as {name!r}).")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ValueError(
                f"Environment {env_id!r}: its module {module!r} cannot be imported ({error})."
            ) from None
    if name not in gym.registry:
        close = difflib.get_close_matches(name, list(gym.registry), n=5, cutoff=0.6)
        hint = f" Similar ids: {', '.join(close)}." if close else ""
        raise ValueError(
            f"Unknown environment {env_id!r}: not registered with gymnasium.{hint} "
            "Use a registered id (e.g. 'CartPole-v1') or register yours first; a JAX "
            "environment of a suite ('gymnax:...', 'brax:...') trains in mode='anakin'."
        )
    spec = copy.deepcopy(gym.spec(name))
    spec.kwargs = {**spec.kwargs, **env_kwargs}
    # The entry points as the objects, not "module:name" strings: an env class of the
    # user's own file then travels to the rollout actors by value (engine.shipping).
    from gymnasium.envs.registration import load_env_creator

    if isinstance(spec.entry_point, str):
        spec.entry_point = load_env_creator(spec.entry_point)
    if isinstance(spec.vector_entry_point, str):
        spec.vector_entry_point = load_env_creator(spec.vector_entry_point)
    return spec


def _gymnasium_spaces(spec, wrappers: tuple) -> Spaces:
    from workbench.learn.rollout import env_spaces

    try:
        return env_spaces(spec, wrappers)
    except TypeError as error:  # an env_kwargs the env does not take
        raise ValueError(f"{spec.id} cannot be made with env_kwargs {spec.kwargs!r}: "
                         f"{error}.") from None
