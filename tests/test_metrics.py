"""The metrics log's joining of per-chip records into one curve, across a restart, and the
board's greedy evaluations of the policies the chips send it."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.engine import TrainConfig
from workbench.engine.metrics import (
    BoardRun,
    EvaluatorSpec,
    MetricsBoard,
    MetricsLog,
    ReturnWindow,
    UpdateRecord,
)
from workbench.engine.plan import plan_run


def _record(update: int, rank: int, returns: list[float] | None = None) -> UpdateRecord:
    return UpdateRecord(update=update, rank=rank, time=float(update), env_steps=100 * update,
                        steps=100, episode_returns=returns or [], step_s=0.01, metrics={})


def _push(log: MetricsLog, updates: range, ranks: range, returns: list[float] | None = None):
    for update in updates:
        for rank in ranks:
            log.add(_record(update, rank, returns))


def test_a_row_closes_only_when_every_chip_has_reported():
    log = MetricsLog(num_chips=2, target_return=475)
    log.add(_record(1, 1))
    assert log.curve == []
    log.add(_record(1, 0))
    assert [r.update for r in log.curve] == [1]


def test_records_arriving_out_of_order_still_make_every_row_in_order():
    # The board takes records on several threads: a chip's update 2 can come before its 1,
    # and a replacement board gets records again that it already joined.
    log = MetricsLog(num_chips=2, target_return=475)
    for update, rank in [(2, 0), (2, 1), (1, 1), (3, 0), (1, 0), (3, 1), (2, 0), (1, 1)]:
        log.add(_record(update, rank, [float(update)]))
    assert [r.update for r in log.curve] == [1, 2, 3]
    assert [r.episodes for r in log.curve] == [2, 4, 6]
    assert log.pending == {}


def test_a_restart_from_a_checkpoint_ahead_of_the_last_joined_row_keeps_the_curve_going():
    # Rank 0 saved update 12 and pushed its record; rank 1 died before pushing update 12.
    log = MetricsLog(num_chips=2, target_return=475)
    _push(log, range(1, 12), range(2))
    log.add(_record(12, 0))
    assert log.curve[-1].update == 11

    log.rewind(12)
    _push(log, range(13, 16), range(2), returns=[500.0] * 25)

    assert [r.update for r in log.curve] == list(range(1, 12)) + [13, 14, 15]
    assert log.snapshot(since=12).train_target.update == 14


def test_a_restart_from_an_older_checkpoint_redoes_the_updates_after_it():
    log = MetricsLog(num_chips=2, target_return=475)
    _push(log, range(1, 12), range(2), returns=[500.0] * 25)
    assert log.target_row.update == 2
    log.rewind(1)
    assert log.target_row is None and [r.update for r in log.curve] == [1]
    _push(log, range(2, 4), range(2), returns=[10.0])
    assert [r.update for r in log.curve] == [1, 2, 3]
    # Only update 1's 50 episodes and the 4 redone ones count: the window is not full yet.
    assert log.curve[-1].episodes == 54 and log.curve[-1].mean_return_100 is None
    assert log.target_row is None


def test_a_greedy_evaluation_of_a_lost_policy_is_forgotten_on_restart():
    log = MetricsLog(num_chips=1, target_return=475)
    _push(log, range(1, 11), range(1))
    log.add_eval(update=4, env_steps=400, mean_return=120.0, time=4.0)
    log.add_eval(update=8, env_steps=800, mean_return=500.0, time=8.0)
    log.rewind(4)
    snapshot = log.snapshot()
    assert [e.update for e in snapshot.evals] == [4]
    assert snapshot.eval_target is None


def test_a_row_reads_as_the_curve_records_it():
    # The keys and their order are the result record's (TrainResult.curve, on_update).
    log = MetricsLog(num_chips=2, target_return=475)
    for rank in range(2):
        log.add(UpdateRecord(update=1, rank=rank, time=1.0 + rank, env_steps=200, steps=200,
                             episode_returns=[10.0 * (rank + 1)], step_s=0.1 * (rank + 1),
                             metrics={"loss": 0.5 + rank}, policy_versions=[0]))
    assert log.rows == [{
        "update": 1, "time": 2.0, "env_steps": 200, "steps_this_update": 200, "episodes": 2,
        "episodes_this_update": 2, "mean_return_this_update": 15.0, "mean_return_100": None,
        "env_steps_per_s": None, "chip_step_s": [0.1, 0.2], "policy_versions": [0],
        "loss": 0.5,
    }]
    assert list(log.rows[0]) == ["update", "time", "env_steps", "steps_this_update",
                                 "episodes", "episodes_this_update", "mean_return_this_update",
                                 "mean_return_100", "env_steps_per_s", "chip_step_s",
                                 "policy_versions", "loss"]
    assert log.train_target is None


def test_a_window_goes_through_a_checkpoint_record_and_seeds_a_resumed_log():
    log = MetricsLog(num_chips=1, target_return=475)
    _push(log, range(1, 4), range(1), returns=[7.0])
    window = log.window_at(2)
    assert window == ReturnWindow(update=2, recent=[7.0, 7.0], episodes=2)
    record = window.to_json()
    assert record == {"update": 2, "recent": [7.0, 7.0], "episodes": 2}
    resumed = MetricsLog(num_chips=1, target_return=475)
    resumed.seed(ReturnWindow.from_json(record))
    _push(resumed, range(3, 4), range(1), returns=[7.0])
    assert [(r.update, r.episodes) for r in resumed.curve] == [(3, 3)]


def _board(env: str) -> tuple[MetricsBoard, dict]:
    """A board (the plain class, as its actor runs it) evaluating CartPole's agent on
    ``env``, and a policy of zeros for that agent."""
    import jax

    agent = plan_run(TrainConfig(env="CartPole-v1")).agent(1)
    built = agent.build()
    shapes = jax.eval_shape(built.policy, jax.eval_shape(built.init, jax.random.PRNGKey(0)))
    zeros = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)
    return MetricsBoard(BoardRun(1, 475, 4, EvaluatorSpec(env, agent, 0))), zeros


def test_the_board_scores_the_policies_sent_to_it_and_drops_those_a_restart_undoes():
    board, zeros = _board("CartPole-v1")
    board.evaluate(zeros, update=4, env_steps=400)
    board.evaluate(zeros, update=8, env_steps=800)
    board.rewind(4)  # update 8's policy is gone with its attempt
    evals = board.snapshot(wait_evals=True).evals
    assert [(e.update, e.env_steps) for e in evals] == [(4, 400)]
    # A policy of zeros always pushes left: CartPole falls over within a dozen steps.
    assert 5 <= evals[0].mean_return <= 15
    final = board.final_returns(zeros, episodes=3)
    assert len(final) == 3 and all(5 <= r <= 15 for r in final)


def test_an_evaluator_that_cannot_be_built_is_the_runs_error():
    board, zeros = _board("NoSuchEnv-v0")
    with pytest.raises(Exception, match="NoSuchEnv"):
        board.final_returns(zeros, episodes=3)
    # The driver's next look at the board raises it too, ending the run.
    with pytest.raises(Exception, match="NoSuchEnv"):
        board.snapshot()


def test_a_kept_board_serves_the_next_run_with_nothing_of_the_last():
    board, zeros = _board("CartPole-v1")
    board.record(_record(1, 0, [12.0]))
    board.evaluate(zeros, update=1, env_steps=100)  # may still run as the next run begins
    agent = plan_run(TrainConfig(env="CartPole-v1")).agent(2)
    board.begin(BoardRun(2, 475, 4, EvaluatorSpec("CartPole-v1", agent, 1)))
    board.record(_record(1, 0))
    news = board.snapshot(wait_evals=True)
    # The new run's first update waits for its second chip; the last run's row and
    # evaluation are gone.
    assert (news.rows, news.evals) == ([], [])
    board.record(_record(1, 1))
    assert [r.update for r in board.snapshot().rows] == [1]
    assert len(board.final_returns(zeros, episodes=2)) == 2
