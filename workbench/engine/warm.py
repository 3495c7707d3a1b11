"""Learner and rollout processes kept warm on a reserved slice.

Starting a chip's learner costs a process, JAX's import and the ``jax.distributed`` join:
tens of seconds on a small machine, most of a short run's start-up; a run's rollout
actors cost a process and JAX's import each, and their keeper a process. A slice reserved
with ``keep_learners`` therefore keeps them after a run that ended cleanly (or has them
started in the background right after its reservation, :func:`start_learners`), and the
next run on it sets them up afresh instead of starting new ones; each run's ``setup``
replaces every piece of per-run state they hold. They are stopped when the slice is
released or recovered, when a learner is found dead, and before anything else needs the
chips' TPU resource (a sweep's programs). Its metrics board, a process on the head, is
kept with them: starting one costs the next run a process (about 2 s here) before the
driver sees its first row or can pass on a stop.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from dataclasses import dataclass, field

from workbench.engine.actors import ChipLearnerActor
from workbench.engine.chip_group import (
    attempt_prefix,
    issue_joins,
    start_chip_actors,
    wait_for_joins,
)
from workbench.engine.cluster_state import head_node_affinity, kill_and_wait, remote
from workbench.engine.config import TrainConfig
from workbench.engine.metrics import BoardRun, EvaluatorSpec, MetricsBoard
from workbench.engine.rollouts import (
    RolloutKey,
    RolloutLayout,
    rollout_layout,
    rollout_runs,
    start_keeper,
    stop_keepers,
)

log = logging.getLogger(__name__)


@dataclass
class LearnerGroup:
    """One learner per chip of a slice, joined (or joining) into one jax.distributed group."""

    learners: list
    placement_group_id: str
    slice_label: str
    join_refs: list
    joined: list = field(default_factory=list)
    """Every learner's :class:`~workbench.engine.actors.JoinReport`, by rank, once joined:
    what each saw of the mesh, checked against the slice."""
    rollout_keeper: object = None
    """The rollout actors' keeper, kept with the learners (None until a run or
    :func:`start_learners` starts one)."""
    rollout_key: RolloutKey | None = None
    """The key of the :class:`~workbench.engine.rollouts.RolloutLayout` they were started
    for."""

    def wait_joined(self, timeout_s: float) -> str:
        """Block until every learner has joined and checked its mesh; returns the
        learners' JAX platform.

        Raises:
            DistributedStartError: naming the ranks that did not join in time.
            MeshMismatchError: they joined, but not into one mesh of the slice's chips.
        """
        if self.join_refs:
            self.joined = wait_for_joins(self.join_refs, timeout_s, self.slice_label)
            self.join_refs = []
        return self.joined[0].mesh.platform

    def rollouts_for(self, layout: RolloutLayout):
        """The kept rollout keeper if its actors are laid out as ``layout`` asks, else
        None (and kept ones laid out otherwise are stopped, freeing their CPUs)."""
        if self.rollout_keeper is not None and self.rollout_key != layout.key:
            self.stop_rollouts()
        return self.rollout_keeper

    def hold_rollouts(self, keeper, layout: RolloutLayout) -> None:
        self.rollout_keeper, self.rollout_key = keeper, layout.key

    def stop_rollouts(self) -> None:
        if self.rollout_keeper is not None:
            stop_keepers([self.rollout_keeper], [])
        self.rollout_keeper = self.rollout_key = None

    def kill(self) -> None:
        keepers = [self.rollout_keeper] if self.rollout_keeper is not None else []
        self.rollout_keeper = self.rollout_key = None
        stop_keepers(keepers, self.learners)


def start_group(tpu_slice, attempt: int, distributed_timeout_s: float) -> LearnerGroup:
    """Start a learner on every chip of ``tpu_slice`` for a run's ``attempt`` and have them
    join, without waiting for either: the caller overlaps the rest of its start-up with
    theirs."""
    learners = start_chip_actors(tpu_slice, ChipLearnerActor,
                                 f"{attempt_prefix(tpu_slice, attempt)}:learner")
    return LearnerGroup(learners, _placement_group_id(tpu_slice), tpu_slice.shape.label,
                        issue_joins(learners, tpu_slice.shape, distributed_timeout_s))


# The groups kept between runs, by slice. Weak: a slice nobody holds is released by its
# own finalizer, which kills its placement group and the learners in it.
_kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def start_learners(tpu_slice, config: TrainConfig | None = None,
                   distributed_timeout_s: float = 120.0) -> None:
    """Start ``tpu_slice``'s learners now, in the background, for its next run.

    Use it right after reserving (the notebook's slice picker does, on the simulated
    cluster): the learners start, import JAX and join while the next cell is written, and
    that cell's :func:`~workbench.train` skips all of it. They also set up and compile
    the learner of a run of ``config`` (the defaults when None), and the rollout actors
    set up its envs and policy, so a run of that config (any seed) also skips tracing
    its programs; any other run still finds JAX warm in them. The run's metrics board
    starts too, its evaluator built for ``config``. The learners hold each
    chip's ``TPU`` resource while idle; :meth:`~workbench.Slice.release` stops them.

    Raises:
        ValueError: the slice is released, or ``config`` cannot work (nothing started).
    """
    if tpu_slice.released:
        raise ValueError("This slice has been released; reserve a new one first.")
    if tpu_slice in _kept:
        return
    from workbench.engine.plan import check_slice, plan_run

    # Only the run's programs matter here: no folder of its own is checked or written.
    plan = plan_run((config or TrainConfig()).replace(run_dir="", checkpoint_dir="",
                                                      resume=False))
    # Rollout actors go where each chip's bundle has a CPU beside its learner.
    rollouts = plan.host_rollouts and tpu_slice.cpus_per_chip >= 2
    if rollouts:
        check_slice(plan, tpu_slice)
    group = start_group(tpu_slice, 0, distributed_timeout_s)
    for learner, joined in zip(group.learners, group.join_refs, strict=True):
        learner.warm_up.remote(plan, joined)
    if rollouts:
        layout = rollout_layout(tpu_slice, attempt_prefix(tpu_slice, 0),
                                plan.rollout_actors_per_host(tpu_slice),
                                plan.config.policy_lag)
        keeper = start_keeper(tpu_slice, layout, rollout_runs(plan, layout, tpu_slice.num_chips))
        group.hold_rollouts(keeper, layout)
    _keep(tpu_slice, group)
    if tpu_slice not in _kept_boards:
        # The run's board too, its evaluator built for ``config``.
        _keep_board(tpu_slice, start_board(tpu_slice, board_run(plan, tpu_slice.num_chips),
                                           board_name(tpu_slice)))


def take(tpu_slice) -> LearnerGroup | None:
    """The slice's kept learners for a new run (they are no longer kept meanwhile), or
    ``None`` when it has none that still answer."""
    import ray

    group = _kept.pop(tpu_slice, None)
    if group is None:
        return None
    if tpu_slice.released or group.placement_group_id != _placement_group_id(tpu_slice):
        group.kill()
        return None
    pings = [learner.__ray_ready__.remote() for learner in group.learners]
    ready, _ = ray.wait(pings, num_returns=len(pings), timeout=30)
    try:
        if len(ready) < len(pings):
            raise TimeoutError("a kept learner did not answer")
        ray.get(pings)
    except Exception as error:
        log.info("kept learners are not usable (%s); starting new ones", error)
        group.kill()
        return None
    return group


def keep(tpu_slice, group: LearnerGroup) -> bool:
    """Keep a finished run's learners (and rollout actors) on the slice for the next run,
    if the slice asks for that and they could be cleared. Returns whether kept; if not,
    the caller stops them. Rollout actors that could not be cleared are stopped here."""
    import ray

    if not tpu_slice.keep_learners or tpu_slice.released:
        return False
    try:
        ray.get([learner.clear.remote() for learner in group.learners], timeout=30)
    except Exception as error:
        log.info("could not clear the run's learners (%s); stopping them", error)
        return False
    if group.rollout_keeper is not None:
        try:
            ray.get(group.rollout_keeper.clear.remote(), timeout=40)
        except Exception as error:
            log.info("could not clear the run's rollout actors (%s); stopping them", error)
            group.stop_rollouts()
    _keep(tpu_slice, group)
    return True


def stop_kept_learners(tpu_slice) -> None:
    """Stop the learners kept on ``tpu_slice`` (nothing if it keeps none)."""
    group = _kept.pop(tpu_slice, None)
    if group is not None:
        with contextlib.suppress(Exception):
            group.kill()


def _keep(tpu_slice, group: LearnerGroup) -> None:
    _kept[tpu_slice] = group
    tpu_slice.on_release("warm learners", lambda: stop_kept_learners(tpu_slice))


def _placement_group_id(tpu_slice) -> str:
    return tpu_slice.placement_group.id.hex()


# The boards kept between runs, by slice (weak for the same reason).
_kept_boards: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def board_run(plan, num_chips: int, log=None) -> BoardRun:
    """What a run's :class:`~workbench.engine.metrics.MetricsBoard` is started (or begun)
    with, continuing ``log`` when given."""
    jax_env = plan.jax_env.make if plan.jax_env is not None else None
    evaluator = EvaluatorSpec(env=plan.env_ref or plan.config.env, agent=plan.agent(num_chips),
                              seed=plan.config.seed, jax_env=jax_env,
                              wrappers=plan.config.wrappers)
    return BoardRun(num_chips=num_chips, target_return=plan.target_return,
                    eval_episodes=plan.config.eval_episodes, evaluator=evaluator, log=log)


def start_board(tpu_slice, run: BoardRun, name: str):
    """Start a metrics board for a run on ``tpu_slice``, on the cluster's head."""
    # Threaded: a checkpointing chip waits in window() while records keep coming, and the
    # final evaluation waits for its episodes. No runtime_env (it would need a fresh
    # worker process): the board picks JAX's platform itself.
    return remote(MetricsBoard, num_cpus=0, max_concurrency=tpu_slice.num_chips + 4).options(
        scheduling_strategy=head_node_affinity(), name=name,
    ).remote(run)


def board_name(tpu_slice, replaced: int = 0) -> str:
    """"<slice>:board" (".1", ".2"... for a run's replacements), so that a person (or a
    fault test) can find it with ray.get_actor."""
    return f"{tpu_slice.name}:board" + (f".{replaced}" if replaced else "")


def take_board(tpu_slice, run: BoardRun):
    """The slice's kept metrics board, set up for a new run of ``run``
    (:func:`board_run`), or ``None`` when it has none that answers."""
    import ray

    board = _kept_boards.pop(tpu_slice, None)
    if board is None:
        return None
    try:
        ray.get(board.begin.remote(run), timeout=30)
    except Exception as error:
        log.info("the kept metrics board is not usable (%s); starting a new one", error)
        with contextlib.suppress(Exception):
            ray.kill(board)
        return None
    return board


def keep_board(tpu_slice, board) -> bool:
    """Keep a cleanly finished run's board for the slice's next run, if the slice keeps
    its learners. Returns whether kept; if not, the caller stops it."""
    if not tpu_slice.keep_learners or tpu_slice.released:
        return False
    _keep_board(tpu_slice, board)
    return True


def _keep_board(tpu_slice, board) -> None:
    _kept_boards[tpu_slice] = board
    tpu_slice.on_release("warm metrics board", lambda: stop_kept_board(tpu_slice))


def stop_kept_board(tpu_slice) -> None:
    """Stop the board kept on ``tpu_slice`` (nothing if it keeps none)."""
    board = _kept_boards.pop(tpu_slice, None)
    if board is not None:
        with contextlib.suppress(Exception):
            kill_and_wait([board])
