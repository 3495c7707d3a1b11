"""Anakin mode: JAX envs rolled out and learned from inside one compiled program per chip.

The rollout's bookkeeping and the in-process learner run here without Ray; the last tests
train through the engine on a simulated v6e 2x2 of the session cluster.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import live_actors

from workbench.algos.ppo import ActorCritic, PPOConfig


def _catch_rollout(steps: int):
    from workbench.anakin import init_envs, make_rollout
    from workbench.envs import make_jax

    env = make_jax("workbench/Catch-v0")
    network = ActorCritic(env.num_actions, (16,))
    params = network.init(jax.random.PRNGKey(0), np.zeros((1,) + env.observation_shape))
    carry = init_envs(env, jax.random.PRNGKey(1), 3)
    rollout = jax.jit(make_rollout(env, network, steps))
    return env, rollout(params, carry, jax.random.PRNGKey(2))


def test_rollout_resets_on_the_next_step_and_masks_it():
    env, (carry, traj, ended) = _catch_rollout(40)
    valid = np.asarray(traj.valid)
    finished = np.asarray(traj.terminated | traj.truncated)
    # Catch episodes last exactly 9 steps; each is followed by one masked reset step.
    assert finished[:, 0].nonzero()[0].tolist() == [8, 18, 28, 38]
    assert (~valid[:, 0]).nonzero()[0].tolist() == [9, 19, 29, 39]
    assert not np.asarray(traj.rewards)[~valid].any(), "a reset step must carry no reward"
    # One return per finished episode, on the step it ended, each a catch (+1) or a miss.
    returns = np.asarray(ended)
    assert np.array_equal(~np.isnan(returns), finished)
    assert set(returns[finished].tolist()) <= {-1.0, 1.0}
    assert traj.obs.shape == (40, 3) + env.observation_shape
    assert traj.last_value.shape == (3,)
    # The last step was a reset: the next rollout starts on fresh episodes.
    assert not bool(carry.done.any()) and not np.asarray(carry.episode_return).any()


def test_same_seed_same_learning_and_catch_learned_to_its_optimum():
    from workbench.anakin import AnakinLearner
    from workbench.envs import make_jax

    config = PPOConfig(num_minibatches=4, learning_rate=2.5e-3)
    env = make_jax("workbench/Catch-v0")

    def learner():
        return AnakinLearner(env, 32, 20, config, num_updates=60, seed=3)

    first, second = learner(), learner()
    a = [first.step() for _ in range(3)]
    b = [second.step() for _ in range(3)]
    assert [r.episode_returns for r in a] == [r.episode_returns for r in b]
    assert [r.metrics for r in a] == [r.metrics for r in b]
    for _ in range(57):
        first.step()
    # Catch's best is +1 every episode: the greedy policy must catch every ball.
    from workbench.rollout import RolloutWorker

    evaluator = RolloutWorker("workbench/Catch-v0", 1, 1, seed=7, hidden_sizes=(64, 64))
    assert evaluator.evaluate(first.params_numpy(), episodes=50) == [1.0] * 50


def test_anakin_refuses_an_env_that_is_not_jax(cluster):
    import workbench as wb
    from workbench.engine import TrainConfig, train

    actors_before = set(live_actors())
    with wb.reserve("v6e", "2x2", timeout_s=60, cpus_per_chip=2) as tpu_slice, \
            pytest.raises(ValueError) as error:
        train(tpu_slice, TrainConfig(env="CartPole-v1", mode="anakin"))
    message = str(error.value)
    assert "workbench/CartPole-v1" in message and "mode='actors'" in message
    assert set(live_actors()) == actors_before


# Anakin CartPole reaching the training target on a simulated 2x2 (final greedy return
# >= 475, every chip identical) is asserted by the learner-kill and lost-host runs of
# test_faults.py, which train exactly that to the end.


def test_greedy_evaluation_of_a_jax_env_compiled_matches_stepping_its_gymnasium_view():
    from workbench.rollout import RolloutWorker

    worker = RolloutWorker("workbench/CartPole-v1", 1, 1, seed=0)
    params = worker.network.init(jax.random.PRNGKey(0), np.zeros((1, 4), np.float32))
    # A policy that always pushes right: its episodes end within a few steps of each
    # other whatever the start state, so both ways of evaluating must agree closely.
    params["params"]["Dense_4"] = {"kernel": np.zeros((64, 2), np.float32),
                                   "bias": np.array([0.0, 1.0], np.float32)}
    compiled = np.array(worker.evaluate(params, 100))
    stepped = worker._evaluate_stepped(params, 100, seed=10_000)
    assert compiled.shape == (100,) and set(np.unique(compiled)) <= set(range(7, 14))
    assert abs(compiled.mean() - stepped.mean()) < 0.5, (compiled.mean(), stepped.mean())
    worker.close()
