"""Faults during training, on the session's simulated cluster: a rollout actor killed (also
as a run starts), a learner killed (rank 0 too), a host lost (worker 0 of a single-host
slice, worker 1 of a two-host slice), the head-pinned helpers lost, a learner hung, two
drivers racing for one slice, and an interrupt. Each run must still end well, and leave
no placement group or actor behind (the ``cluster`` fixture checks placement groups).

The faults that keep their slice share one (``two_by_two``): a run there takes the learners
the run before it kept, so each test pays for the fault it makes, not for a cold start.
The lost host of a 2x2 moves its run to the session's other 2x2, so it runs first, before
``two_by_two`` holds one of them."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import ray
from support.cluster_state import live_actor_names, live_actors, live_placement_groups

import workbench as wb
from workbench.engine import TrainConfig, checkpoint, train

# Every test here trains on the session cluster through a fault: the slow tier.
pytestmark = pytest.mark.slow

ANAKIN_CARTPOLE = dict(env="workbench/CartPole-v1", mode="anakin", total_env_steps=600_000,
                       stop_at_target=True, eval_every=0)


@pytest.fixture
def shared_slice(two_by_two):
    """The module's slice, checked to leave no other placement group behind, and no actor
    but the learners, rollout actors and metrics board it keeps for the next test."""
    groups, actors = live_placement_groups(), set(live_actors())
    yield two_by_two
    # A restart re-reserves the slice, which replaces its placement group: the count is
    # what must not grow.
    assert len(live_placement_groups()) == len(groups), "this test left a placement group"
    assert two_by_two.placement_group.id.hex() in live_placement_groups()
    kept = set(_kept(two_by_two, ":learner-", ":rollout")) | {
        actor_id for actor_id, name in live_actor_names().items()
        if name == f"{two_by_two.name}:board"}
    assert set(live_actors()) - actors - kept == set(), "this test left actors behind"


def _kept(tpu_slice, *roles: str) -> dict[str, str]:
    """The live actors of ``tpu_slice``'s runs in one of ``roles`` by actor id: kept ones
    carry the name of the attempt that started them (``<slice>:a<attempt>:learner-<rank>``,
    ``...:rollout-<i>`` or, replaced, ``...:rollout-<i>.<n>``, and ``...:rollouts``)."""
    return {actor_id: name for actor_id, name in live_actor_names().items()
            if name.startswith(f"{tpu_slice.name}:a") and any(role in name for role in roles)}


def _learners(tpu_slice) -> dict[str, str]:
    return _kept(tpu_slice, ":learner-")


def rollout_actor(tpu_slice, index: int):
    """The live rollout actor ``index`` of ``tpu_slice``, or None before it is started."""
    names = [n for n in _kept(tpu_slice, ":rollout-").values()
             if n.rpartition(":rollout-")[2].split(".")[0] == str(index)]
    return ray.get_actor(names[0]) if names else None


def learner_name(tpu_slice, rank: int) -> str:
    """The name of the live learner of ``rank`` on ``tpu_slice``."""
    (name,) = [n for n in _learners(tpu_slice).values() if n.endswith(f":learner-{rank}")]
    return name


def _once(action):
    """An on_update callback that runs ``action(row, ...)`` once, at update 8."""
    fired = threading.Event()

    def on_update(row: dict) -> None:
        if row["update"] >= 8 and not fired.is_set():
            fired.set()
            action(row)

    return on_update, fired


def test_a_lost_host_moves_the_run_to_an_intact_slice(cluster, sim_cluster, tmp_path):
    config = TrainConfig(**ANAKIN_CARTPOLE, seed=2, checkpoint_dir=str(tmp_path),
                         checkpoint_every=4)
    lost: list[str] = []

    def lose_host(row: dict) -> None:
        lost.append(tpu_slice.name)
        sim_cluster.remove_host(tpu_slice.name, 0)

    try:
        with wb.reserve("v6e", "2x2", timeout_s=60, cpus_per_chip=2) as tpu_slice:
            on_update, fired = _once(lose_host)
            result = train(tpu_slice, config, on_update=on_update, recover_timeout_s=120)
            assert tpu_slice.name != lost[0], "the run should have moved to the other 2x2"
    finally:
        if lost:
            sim_cluster.add_host(lost[0], 0)  # the session cluster gets its slice back
    assert result.restarts == 1 and result.recovery_s < 60
    per_update = 4 * 16 * 64
    assert 0 <= result.env_steps_redone <= 6 * per_update, result.env_steps_redone
    # The bar is the training target, counted only over episodes of the restored policy's
    # line (the curve was rewound to the checkpoint). The greedy evaluation taken the
    # moment a restarted run reaches it varies more (seen from 349 to 500); a policy that
    # lost what it learned scores near 20.
    assert result.time_to_train_target_s is not None
    reached = [r for r in result.curve if r["env_steps"] == result.env_steps_to_train_target]
    assert reached and reached[0]["mean_return_100"] >= 475
    assert result.curve[-1]["mean_return_100"] >= 400
    assert result.final_return >= 250


def test_a_lost_host_that_is_not_worker_0_of_a_multi_host_slice(cluster, sim_cluster,
                                                                tmp_path):
    # Eight learners share two cores here: a target of 100 instead of 475 (five times a
    # random policy's return) shortens the training after the restart, which is not what
    # this test is about (the 2x2's lost host above holds the restored policy to 475).
    config = TrainConfig(**{**ANAKIN_CARTPOLE, "envs_per_chip": 8, "target_return": 100},
                         seed=3, checkpoint_dir=str(tmp_path), checkpoint_every=4)
    lost: list[str] = []

    def lose_host(row: dict) -> None:
        lost.append(tpu_slice.name)
        sim_cluster.remove_host(tpu_slice.name, 1)
        # The host comes back after a while, as a repaired VM would: the recovery waits.
        threading.Timer(5.0, sim_cluster.add_host, (tpu_slice.name, 1)).start()

    with wb.reserve("v5p", "2x2x2", timeout_s=60, cpus_per_chip=2) as tpu_slice:
        assert tpu_slice.num_hosts == 2
        on_update, fired = _once(lose_host)
        result = train(tpu_slice, config, on_update=on_update, recover_timeout_s=120)
    assert fired.is_set() and result.restarts == 1 and result.hosts == 2
    assert result.time_to_train_target_s is not None
    assert len(set(result.chip_state_digests)) == 1


TWO_DRIVERS = """
import json, sys
import workbench as wb
wb.connect({address!r}, node_ip={node_ip!r})
try:
    with wb.reserve("v6e", "2x4", timeout_s=5) as held:
        print(json.dumps({{"got": held.name}}), flush=True)
        sys.stdin.readline()  # held until the test has seen the other driver refused
except wb.SliceUnavailableError as error:
    print(json.dumps({{"refused": str(error)}}), flush=True)
"""


def _json_line(stream) -> dict:
    """The first line of ``stream`` that is a JSON object; {} if it ends without one."""
    import json

    for line in stream:
        if line.startswith("{"):
            return json.loads(line)
    return {}


def test_two_drivers_reserving_the_one_slice_at_once(cluster, sim_cluster):
    import subprocess
    import sys

    code = TWO_DRIVERS.format(address=sim_cluster.address, node_ip=sim_cluster.node_ip)
    drivers = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(2)]
    try:
        # Each prints its answer as a line of JSON: the holder at once, the other when
        # its reservation times out while the holder still holds.
        answers = [_json_line(driver.stdout) for driver in drivers]
    finally:
        # The holder lets go at the line it waits for.
        ends = [driver.communicate(input="\n", timeout=60) for driver in drivers]
    for driver, (_, err) in zip(drivers, ends, strict=True):
        assert driver.returncode == 0, err[-2000:]
    assert sorted(answers[0].keys() | answers[1].keys()) == ["got", "refused"], answers
    refusal = next(a["refused"] for a in answers if "refused" in a)
    assert "Could not reserve a v6e 2x4 slice" in refusal and "in use" in refusal
    # The `cluster` fixture checks that neither left a placement group behind.


def test_a_killed_rollout_actor_is_replaced_and_the_run_reaches_its_target(shared_slice):
    on_update, fired = _once(lambda row: ray.kill(rollout_actor(shared_slice, 0)))
    # A target below CartPole's 475 keeps the test short; the learning after the
    # replacement is what is checked.
    result = train(shared_slice, TrainConfig(seed=0, stop_at_target=True, target_return=200,
                                             eval_every=0), on_update=on_update)
    assert fired.is_set()
    assert result.rollout_actors_replaced == 1 and result.restarts == 0
    assert result.time_to_train_target_s is not None and result.final_return >= 150
    assert len(set(result.chip_state_digests)) == 1


def test_a_lost_metrics_board_is_replaced_and_the_curve_and_evaluations_go_on(shared_slice):
    config = TrainConfig(**{**ANAKIN_CARTPOLE, "eval_every": 4}, seed=0)

    def lose_board(row: dict) -> None:
        ray.kill(ray.get_actor(f"{shared_slice.name}:board"))

    on_update, fired = _once(lose_board)
    result = train(shared_slice, config, on_update=on_update)
    assert fired.is_set() and result.helpers_replaced == 1 and result.restarts == 0
    # The chips send their recent records again to the new board: no row is missing.
    assert [row["update"] for row in result.curve] == list(range(1, result.updates + 1))
    # The training target was reached after the replacement, and the new board scored
    # the final policy. Its greedy episodes, taken the moment the run reaches the target,
    # vary with when the evaluations ran (seen 274 to 500); a lost policy scores near 20.
    assert result.time_to_train_target_s is not None and result.final_return >= 200


def test_a_rollout_actor_dying_as_the_run_starts_is_replaced(shared_slice):
    errors: list[BaseException] = []
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(train(shared_slice, TrainConfig(seed=0, total_env_steps=8 * 4096,
                                                           eval_every=0)))
        except BaseException as error:  # handed to the test below
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 120
    # As soon as there is one: kept from the run before (then being set up for this one)
    # or new (then still compiling its policy).
    while (actor := rollout_actor(shared_slice, 0)) is None:
        assert time.monotonic() < deadline, "the rollout actor never appeared"
        time.sleep(0.05)
    ray.kill(actor)
    thread.join(300)
    assert not errors, errors
    (result,) = outcome
    assert result.rollout_actors_replaced == 1 and result.updates == 8


def _kill_learner(tpu_slice, rank: int):
    """An on_update callback that kills the chip's learner of ``rank`` at update 8."""
    return _once(lambda row: ray.kill(ray.get_actor(learner_name(tpu_slice, rank))))


def test_a_killed_learner_restarts_from_the_last_checkpoint(shared_slice, tmp_path):
    config = TrainConfig(**ANAKIN_CARTPOLE, seed=1, checkpoint_dir=str(tmp_path),
                         checkpoint_every=4)
    on_update, fired = _kill_learner(shared_slice, 1)
    result = train(shared_slice, config, on_update=on_update)
    assert fired.is_set() and result.restarts == 1
    per_update = 4 * 16 * 64
    # Killed after update 8 with a checkpoint at 8 (or 4): at most a few updates redone.
    assert 0 <= result.env_steps_redone <= 6 * per_update, result.env_steps_redone
    assert result.time_to_train_target_s is not None and result.final_return >= 475
    assert len(set(result.chip_state_digests)) == 1


def test_losing_rank_0_the_coordinator_restarts_from_the_last_checkpoint(shared_slice,
                                                                        tmp_path):
    config = TrainConfig(**ANAKIN_CARTPOLE, seed=1, checkpoint_dir=str(tmp_path),
                         checkpoint_every=4)
    on_update, fired = _kill_learner(shared_slice, 0)
    result = train(shared_slice, config, on_update=on_update)
    assert fired.is_set() and result.restarts == 1
    assert result.time_to_train_target_s is not None
    assert len(set(result.chip_state_digests)) == 1


def test_a_hung_learner_is_caught_by_the_progress_watchdog(shared_slice, tmp_path):
    import psutil
    from ray._private.state import actors

    config = TrainConfig(**ANAKIN_CARTPOLE, seed=2, checkpoint_dir=str(tmp_path),
                         checkpoint_every=4, progress_timeout_s=5)
    stopped: list[int] = []

    def hang_a_learner(row: dict) -> None:
        actor_id = ray.get_actor(learner_name(shared_slice, 2))._actor_id.hex()
        pid = actors()[actor_id]["Pid"]
        psutil.Process(pid).suspend()  # SIGSTOP: alive, holding its chip, answering nothing
        stopped.append(pid)

    on_update, fired = _once(hang_a_learner)
    result = train(shared_slice, config, on_update=on_update)
    assert fired.is_set() and result.restarts == 1
    assert result.time_to_train_target_s is not None
    assert not psutil.pid_exists(stopped[0]) or \
        psutil.Process(stopped[0]).status() == psutil.STATUS_ZOMBIE


def test_ctrl_c_stops_within_seconds_with_a_final_checkpoint(shared_slice, tmp_path,
                                                          python_ctrl_c):
    config = TrainConfig(**{**ANAKIN_CARTPOLE, "stop_at_target": False}, seed=0,
                         checkpoint_dir=str(tmp_path), checkpoint_every=1000)
    sent: list[float] = []

    def interrupt(row: dict) -> None:
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C in a terminal or a notebook does

    on_update, _ = _once(interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(shared_slice, config, on_update=on_update)
    stopped = time.monotonic() - sent[0]
    assert stopped < 15, f"took {stopped:.1f} s to stop"
    step = checkpoint.latest_step(str(tmp_path))
    assert step is not None and step >= 8, "no final checkpoint of the interrupted run"


def test_losing_chips_more_often_than_max_restarts_says_so(shared_slice):
    config = TrainConfig(**ANAKIN_CARTPOLE, seed=1, max_restarts=0)
    on_update, _ = _kill_learner(shared_slice, 1)
    with pytest.raises(wb.engine.ChipLost) as error:
        train(shared_slice, config, on_update=on_update)
    assert "after 0 restart(s), the most config.max_restarts allows" in str(error.value)
    assert "wb.list_slices()" in str(error.value)
