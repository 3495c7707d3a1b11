"""RLlib's actors inside a reserved slice: one learner per chip bundle, env runners on the
hosts' CPUs of the same bundles.

RLlib 2.60 starts its env runners and learners itself, outside any placement group unless
it runs inside a Tune trial. Three narrow seams put them in the slice's instead, each a
wrapper that does nothing for an algorithm built without a placement:

- ``EnvRunnerGroup._make_worker``: an env runner gets a scheduling strategy naming one of
  the slice's bundles (runners are spread over the chips' bundles, host CPUs beside the
  chip's learner);
- ``AlgorithmConfig.build_learner_group``: the learner group is given the slice's
  placement group, where each learner's ``{"TPU": 1}`` takes one chip's bundle;
- ``learner_group._get_backend_config``: the learners' ``torch.distributed`` collective is
  the slice's (Ray Train would pick ``tpu_dist`` for any worker holding ``TPU``, which the
  simulated slice's CPU hosts cannot run).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from workbench.engine.rllib.backend import LearnerBackend
from workbench.engine.rllib.learner import chip_learner_class

LEARNER_CPUS = 1.0
"""Host CPUs each learner holds in its chip's bundle (RLlib's own default for a learner
without a GPU)."""


@dataclass(frozen=True)
class SlicePlacement:
    """Where one RLlib algorithm's actors go on a slice."""

    placement_group: Any
    chip_bundles: tuple[int, ...]
    """The slice's bundle indices, chip by chip in rank order."""
    num_env_runners: int
    backend: LearnerBackend

    def runner_bundle(self, worker_index: int, in_evaluation: bool) -> int:
        """The bundle of env runner ``worker_index`` (1-based, as RLlib numbers them);
        evaluation runners come after the training runners, round the chips."""
        position = worker_index - 1 + (self.num_env_runners if in_evaluation else 0)
        return self.chip_bundles[position % len(self.chip_bundles)]

    def runner_strategy(self, worker_index: int, in_evaluation: bool):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(
            placement_group=self.placement_group,
            placement_group_bundle_index=self.runner_bundle(worker_index, in_evaluation),
            # What a runner starts (its env's own processes) stays in the reservation too.
            placement_group_capture_child_tasks=True,
        )


def learner_count(config, chips: int) -> int:
    """How many learners the run gets: the config's ``num_learners``, each on a chip of its
    own, or one per chip when it is 0 (RLlib's default for most algorithms: one learner in
    the driver). IMPALA and APPO default to 1.

    Raises:
        ValueError: more learners than the slice has chips.
    """
    asked = int(config.num_learners or 0)
    if asked > chips:
        raise ValueError(
            f"The config asks for {asked} learners but the slice has {chips} chips, one "
            f"learner each: leave num_learners unset (one per chip) or set it to at most "
            f"{chips}, or reserve a bigger slice.")
    return asked or chips


def check_fits(config, chips: int, cpus_per_chip: float, learners: int) -> None:
    """Refuse a config whose env runners and learners do not fit the slice's bundles
    (they would wait for CPUs forever); says what fits.

    Raises:
        ValueError: the runners and learners need more host CPUs than a bundle holds.
    """
    runners = int(config.num_env_runners or 0) + int(config.evaluation_num_env_runners or 0)
    runner_cpus = float(config.num_cpus_per_env_runner)
    if float(config.num_gpus_per_env_runner or 0) > 0 or config.num_gpus_per_learner:
        raise ValueError("A TPU slice has no GPUs: set num_gpus_per_env_runner and "
                         "num_gpus_per_learner to 0.")
    # Learners may land on any chip's bundle, so every bundle keeps room for one.
    per_bundle = math.ceil(runners / chips) * runner_cpus + (LEARNER_CPUS if learners else 0)
    if per_bundle > cpus_per_chip + 1e-9:
        room = max(0, int((cpus_per_chip - LEARNER_CPUS) // runner_cpus) * chips)
        raise ValueError(
            f"{runners} env runners of {runner_cpus:g} CPU and {learners} learners of "
            f"{LEARNER_CPUS:g} CPU need {per_bundle:g} CPUs in some chip's bundle, and the "
            f"slice reserved {cpus_per_chip:g} per chip: ask for at most {room} env runners "
            f"(config.env_runners(num_env_runners=...)), or reserve with a larger "
            f"cpus_per_chip.")


def placed_config(config, tpu_slice, backend: LearnerBackend):
    """A copy of ``config`` whose learners hold one chip each, and the placement of its
    actors on ``tpu_slice`` (which :func:`check_fits` has accepted).

    Raises:
        ValueError: more learners than chips.
    """
    learners = learner_count(config, tpu_slice.num_chips)
    placed = config.copy(copy_frozen=False)
    placed.learners(num_learners=learners, num_cpus_per_learner=LEARNER_CPUS,
                    num_gpus_per_learner=0, custom_resources_per_learner={"TPU": 1})
    placed.training(learner_class=chip_learner_class(config.learner_class, backend))
    placement = SlicePlacement(
        placement_group=tpu_slice.placement_group,
        chip_bundles=tuple(chip.bundle_index for chip in tpu_slice.chips),
        num_env_runners=int(config.num_env_runners or 0),
        backend=backend,
    )
    return placed, placement


_building: contextvars.ContextVar[SlicePlacement | None] = contextvars.ContextVar(
    "workbench_rllib_placement", default=None)
_PLACEMENT_ATTR = "_workbench_placement"


@contextlib.contextmanager
def building_on(placement: SlicePlacement) -> Iterator[None]:
    """Build (or restore) an algorithm inside ``placement``: its env runner groups, learner
    group and learners' collective all take it."""
    _install_seams()
    token = _building.set(placement)
    try:
        yield
    finally:
        _building.reset(token)


def bind(algorithm, placement: SlicePlacement) -> None:
    """Keep a built algorithm's later actors (env runners RLlib restarts) in ``placement``,
    and its slice's placement group alive when RLlib shuts its learners down."""
    for group in (algorithm.env_runner_group, getattr(algorithm, "eval_env_runner_group", None)):
        if group is not None:
            setattr(group, _PLACEMENT_ATTR, placement)
    executor = getattr(algorithm.learner_group, "_backend_executor", None)
    if executor is not None:
        # NOTE: Ray Train removes its executor's placement group at shutdown; here that
        # group is the slice's, which outlives the run (the user releases it).
        executor._placement_group = None


_installed = False


def _install_seams() -> None:
    global _installed
    if _installed:
        return
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.rllib.core.learner import learner_group
    from ray.rllib.env.env_runner_group import EnvRunnerGroup

    make_worker = EnvRunnerGroup._make_worker

    def _make_worker(self, *, worker_index: int, config, **kwargs):
        placement = getattr(self, _PLACEMENT_ATTR, None) or _building.get()
        if placement is None or worker_index == 0:
            return make_worker(self, worker_index=worker_index, config=config, **kwargs)
        remote_args = self._remote_args
        # ``config`` may be an object ref here; the group's own config says which it is.
        in_evaluation = bool(self._remote_config.in_evaluation)
        strategy = placement.runner_strategy(worker_index, in_evaluation)
        self._remote_args = {**remote_args, "scheduling_strategy": strategy}
        try:
            return make_worker(self, worker_index=worker_index, config=config, **kwargs)
        finally:
            self._remote_args = remote_args

    build_learner_group = AlgorithmConfig.build_learner_group

    def _build_learner_group(self, *, placement_group=None, **kwargs):
        placement = _building.get()
        if placement is not None and placement_group is None:
            placement_group = placement.placement_group
        return build_learner_group(self, placement_group=placement_group, **kwargs)

    backend_config = learner_group._get_backend_config

    def _get_backend_config(learner_class):
        config = backend_config(learner_class)
        placement = _building.get()
        if placement is not None:
            config.backend = placement.backend.collective
        return config

    EnvRunnerGroup._make_worker = _make_worker
    AlgorithmConfig.build_learner_group = _build_learner_group
    learner_group._get_backend_config = _get_backend_config
    _installed = True
