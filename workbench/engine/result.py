"""The record a training run leaves (also written by ``workbench train --json``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainResult:
    """What a run did, in the units a user reads."""

    env_steps: int
    wall_s: float
    """Seconds of training loop, from the first update's start to the last one's end."""
    final_return: float
    """Mean return of the greedy evaluation at the end."""
    env_steps_per_s: float
    time_to_eval_target_s: float | None
    """Loop seconds until a greedy evaluation first reached the target."""
    time_to_train_target_s: float | None
    """Loop seconds until the last 100 training episodes first averaged the target."""
    env_steps_to_train_target: int | None
    startup_s: float
    """Seconds from the call to the first update: actors, jax.distributed, compiles."""
    generation: str
    topology: str
    chips: int
    hosts: int
    mode: str
    algo: str
    env: str
    sync: str
    """The strategy that kept chips equal: ``gradients`` or ``batch``."""
    seed: int
    updates: int
    checkpoint: str | None
    """The last checkpoint written (a step folder)."""
    run_dir: str | None = None
    engine: str = "jax"
    """Which engine ran it: ``jax`` (the workbench's own learners) or ``rllib``."""
    """The run's folder: ``run.json``, ``result.json``, ``checkpoints/``."""
    target_return: float | None = None
    """The target both target times are measured against (None: the env has none)."""
    resumed_from_update: int | None = None
    """The checkpointed update a resumed run continued from."""
    exact_resume: bool | None = None
    """Whether a resumed run's environments were restored too (same slice shape), so that
    it goes on exactly as the run it continues would have."""
    restarts: int = 0
    """Times the run started again on an intact slice after losing a learner or host."""
    env_steps_redone: int = 0
    """Env steps learned before a loss and lost with it (after the last checkpoint)."""
    recovery_s: float = 0.0
    """Seconds spent getting an intact slice back after losses."""
    rollout_actors_per_host: int = 0
    """Rollout actors each host ran (actors mode; 0 in Anakin mode): the config's count, or
    the one chosen from the hosts' CPUs."""
    rollout_actors_replaced: int = 0
    """Rollout actors that died and were replaced (their batch in flight was lost)."""
    helpers_replaced: int = 0
    """Metrics boards (each also the run's evaluator) that were lost and replaced."""
    startup_profile: dict = field(default_factory=dict)
    """Where the start-up went: seconds from the attempt's start until the learners had
    joined (``learners_joined_s``), were set up (``learners_set_up_s``) and had compiled
    (``compiled_s``), and whether they were kept warm from an earlier run (``warm``)."""
    chip_state_digests: list[str] = field(default_factory=list)
    """SHA-256 of each chip's learner state at the end; all equal."""
    curve: list[dict] = field(default_factory=list)
    """One row per update: env steps, returns, throughput, per-chip step times, losses."""
    params: Any = field(default=None, repr=False)
    """The final policy (numpy), e.g. to render it; not in the JSON record."""
    agent: Any = field(default=None, repr=False)
    """How to build the algorithm's functions for these params; not in the JSON record."""

    def to_json(self) -> dict:
        record = dataclasses.asdict(dataclasses.replace(self, params=None, agent=None))
        del record["params"], record["agent"]
        return record

    def greedy_policy(self) -> Callable[[Any], Any]:
        """The trained policy as ``act(obs) -> action`` for one observation (jitted, on
        this process's CPU), e.g. to play an episode or draw it.

        Raises:
            ValueError: the result holds no policy (a record read back from JSON).
        """
        if self.params is None or self.agent is None:
            raise ValueError("This result holds no policy (only a live run's result does).")
        import jax

        greedy, params = self.agent.build().greedy, self.params
        one = jax.jit(lambda obs: greedy(params, obs[None])[0])
        return lambda obs: one(obs)
