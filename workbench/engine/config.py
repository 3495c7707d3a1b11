"""What a run learns and for how long. Where it runs is the reserved slice; the
algorithm's hyperparameters are its own config dataclass, nested here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from workbench.engine.fields import ConfigError, check_finite, check_seconds, check_whole

Mode = Literal["actors", "anakin"]
Sync = Literal["auto", "gradients", "batch"]
MAX_ENV_STEPS = 10**10
MAX_SEED = 2**31 - 1


@dataclass(frozen=True)
class TrainConfig:
    """One training run: environment, algorithm, budget, and how it is laid out."""

    env: str = "CartPole-v1"
    """A registered gymnasium id (actors mode) or a JAX environment id (Anakin mode,
    ``workbench.envs.jax_env_ids()``)."""
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments of the env: gymnasium.make's, or a JAX env's parameters."""
    wrappers: tuple[str, ...] = ()
    """Actors mode: gymnasium wrappers around every env, innermost first: names in
    gymnasium.wrappers, 'module:Class', or (from Python) the classes themselves."""
    algo: str = "ppo"
    """The algorithm's registered name (``workbench.algos.names()``)."""
    algo_config: Any = None
    """The algorithm's hyperparameters (its config dataclass); None for its defaults."""
    mode: Mode = "actors"
    """``actors``: gymnasium envs stepped by rollout actors on the hosts' CPUs.
    ``anakin``: JAX envs stepped on each chip, rollout and update in one program."""
    total_env_steps: int = 500_000
    """Budget of environment steps over all chips."""
    seed: int = 0
    """Seeds everything through one key tree; same seed and slice, same curve."""
    rollout_actors_per_host: int = 0
    """Rollout actors on each host (actors mode); each feeds an equal share of its chips.
    0 lets the workbench choose from the host's CPUs: one for an env with a vectorised
    implementation, else one per chip that the reservation has a CPU for (on a simulated
    slice, no more than this machine's cores allow)."""
    policy_lag: int = 1
    """Actors mode: how many updates ahead of a learner its rollout actors run. 1: each
    rollout overlaps one update, with the policy exactly one version behind; more keeps
    the actors busy while the learners learn (IMPALA's V-trace corrects for the lag).
    Every lag is reproducible: rollouts run in update order."""
    envs_per_chip: int = 16
    """Environments stepped for each chip's learner per rollout."""
    rollout_length: int = 64
    """Steps per environment in one rollout."""
    eval_every: int = 5
    """Updates between greedy evaluations (0: only the final one)."""
    eval_episodes: int = 20
    """Episodes per greedy evaluation."""
    target_return: float | None = None
    """Return both targets are measured against; None takes the env's own (its
    ``reward_threshold``), and an env without one has no target."""
    stop_at_target: bool = False
    """End the run once the training target is reached (needs a target)."""
    run_dir: str | None = None
    """The run's own folder (its checkpoints and records); None: a new folder under
    ``$WORKBENCH_RUNS`` (default ``./runs``). On a real cluster, a path every host sees."""
    checkpoint_dir: str | None = None
    """Where orbax checkpoints go; None: ``<run_dir>/checkpoints``."""
    checkpoint_every: int = 0
    """Updates between checkpoints (0: by time only); a final one is always written."""
    checkpoint_every_s: float = 60.0
    """Seconds between checkpoints (0: by update count only): what an eviction can lose."""
    resume: bool = False
    """Continue the run whose checkpoints are in ``checkpoint_dir`` (its latest)."""
    sync: Sync = "auto"
    """How chips stay equal: ``gradients`` (an all-reduce per minibatch), ``batch`` (gather
    the batch once per update; one chip learns from it and hands the result to the
    others), or ``auto``: ``batch`` for CPU learners (the simulated slice), ``gradients``
    on TPUs."""
    max_restarts: int = 2
    """Times a run starts again on an intact slice after a learner or a host is lost,
    from the last checkpoint in ``checkpoint_dir`` (from scratch without one)."""
    progress_timeout_s: float = 180.0
    """Seconds without a finished update after which the attempt counts as hung (a learner
    that stopped answering) and the run restarts from its last checkpoint."""
    track: Literal["tensorboard", "mlflow"] | None = None
    """Where the run's curve, evaluations and config also go: ``tensorboard`` (event files
    in the run's folder) or ``mlflow`` (a run in an MLflow tracking store)."""
    tracking_uri: str | None = None
    """MLflow's tracking URI for ``track="mlflow"``; None: a local store beside the runs."""

    @property
    def steps_per_update(self) -> int:
        """Env steps each chip learns from per update."""
        return self.envs_per_chip * self.rollout_length

    def num_updates(self, num_chips: int) -> int:
        return max(1, self.total_env_steps // (self.steps_per_update * num_chips))

    def algorithm(self):
        """The registered :class:`~workbench.algos.Algorithm` named by ``algo``."""
        import workbench.algos as algos

        return algos.get(self.algo)

    def hyperparameters(self) -> Any:
        """``algo_config``, or the algorithm's defaults when it is None."""
        return self.algo_config if self.algo_config is not None else \
            self.algorithm().default_config()

    def validate(self) -> None:
        """Raise :class:`~workbench.engine.fields.ConfigError` (a ``ValueError``) naming the
        first field that cannot work, with what is valid."""
        from workbench.learn.modes import MODES
        from workbench.learn.sync import CHOICES

        if not isinstance(self.env, str) or not self.env:
            raise ConfigError("env", f"must be a gymnasium id such as 'CartPole-v1', got "
                                     f"{self.env!r}.")
        for name in ("total_env_steps", "envs_per_chip", "rollout_length", "eval_episodes",
                     "policy_lag"):
            check_whole(name, getattr(self, name), 1)
        if self.total_env_steps > MAX_ENV_STEPS:
            raise ConfigError("total_env_steps", f"={self.total_env_steps} is beyond any run "
                                                 f"here (at most {MAX_ENV_STEPS:.0e}).")
        for name in ("eval_every", "checkpoint_every", "seed", "max_restarts",
                     "rollout_actors_per_host"):
            check_whole(name, getattr(self, name), 0)
        if self.seed > MAX_SEED:
            raise ConfigError("seed", f"must be at most {MAX_SEED}, got {self.seed}.")
        if self.resume and not self.checkpoint_dir and not self.run_dir:
            raise ConfigError("resume", "=True needs checkpoint_dir (or run_dir): the run to "
                                        "continue from.")
        for name in ("checkpoint_every_s", "progress_timeout_s"):
            check_seconds(name, getattr(self, name), zero_allowed=True)
        if self.progress_timeout_s and self.progress_timeout_s < 5:
            raise ConfigError("progress_timeout_s", f"must be 0 (off) or at least 5 seconds, "
                                                    f"got {self.progress_timeout_s!r}.")
        if self.mode not in MODES:
            raise ConfigError("mode", f"must be one of {', '.join(MODES)}, got {self.mode!r}.")
        if self.sync not in CHOICES:
            raise ConfigError("sync", f"must be 'auto', 'gradients' or 'batch', got "
                                      f"{self.sync!r}.")
        if self.target_return is not None:
            check_finite("target_return", self.target_return)
        from workbench.engine.tracking import check_backend

        check_backend(self.track)
        if not isinstance(self.env_kwargs, dict) or not all(isinstance(k, str)
                                                            for k in self.env_kwargs):
            raise ConfigError("env_kwargs", f"must be a mapping of argument names to values, "
                                            f"got {self.env_kwargs!r}.")
        if not isinstance(self.wrappers, tuple):
            raise ConfigError("wrappers", f"must be a tuple of wrappers, got {self.wrappers!r}.")
        algorithm = self.algorithm()
        hyperparameters = self.hyperparameters()
        if not isinstance(hyperparameters, algorithm.config_type):
            raise ConfigError(
                "algo_config", f"for {algorithm.name} must be a "
                f"{algorithm.config_type.__name__}, got {type(hyperparameters).__name__}."
            )
        validate = getattr(hyperparameters, "validate", None)
        if callable(validate):
            validate(self.steps_per_update)

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)
