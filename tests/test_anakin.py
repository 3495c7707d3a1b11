"""Anakin mode: JAX envs rolled out and learned from inside one compiled program per chip.

The rollout's bookkeeping and the in-process learner run here without Ray; the last tests
train through the engine on a simulated v6e 2x2 of the session cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import jax
import numpy as np
import pytest
from support.cluster_state import live_actors

from workbench.algos import Spaces
from workbench.algos.normalize import init_stats
from workbench.algos.policies import make_policy
from workbench.algos.ppo import PPOConfig, make_act
from workbench.engine import TrainConfig
from workbench.engine.plan import plan_run


def _catch_rollout(steps: int):
    from workbench.envs import make_jax
    from workbench.learn.anakin import init_envs, make_rollout

    env = make_jax("workbench/Catch-v0")
    config = PPOConfig(hidden_sizes=(16,))
    policy = make_policy(Spaces(env.observation_shape, "discrete", num_actions=3), config)
    params = policy.network.init(jax.random.PRNGKey(0), np.zeros((1,) + env.observation_shape))
    carry = init_envs(env, jax.random.PRNGKey(1), 3)
    rollout = jax.jit(make_rollout(env, make_act(policy, config), steps))
    return env, rollout((params, init_stats(env.observation_shape)), carry,
                        jax.random.PRNGKey(2))


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
    assert traj.last_obs.shape == (3,) + env.observation_shape
    assert set(traj.extras) == {"log_prob", "value"} and traj.extras["value"].shape == (40, 3)
    # The last step was a reset: the next rollout starts on fresh episodes.
    assert not bool(carry.done.any()) and not np.asarray(carry.episode_return).any()


def test_same_seed_same_learning_and_catch_learned_to_its_optimum():
    from workbench.learn.anakin import AnakinLearner
    from workbench.learn.evaluation import GreedyEvaluator

    config = TrainConfig(env="workbench/Catch-v0", mode="anakin", envs_per_chip=32,
                         rollout_length=20, total_env_steps=60 * 32 * 20, seed=3,
                         algo_config=PPOConfig(num_minibatches=4, learning_rate=2.5e-3))
    plan = plan_run(config)
    setup = plan.learner_setup(1, "gradients")

    first, second = AnakinLearner(setup), AnakinLearner(setup)
    a = [first.step() for _ in range(3)]
    b = [second.step() for _ in range(3)]
    assert [r.episode_returns for r in a] == [r.episode_returns for r in b]
    assert [r.metrics for r in a] == [r.metrics for r in b]
    for _ in range(57):
        first.step()
    # Catch's best is +1 every episode: the greedy policy must catch every ball.
    evaluator = GreedyEvaluator("workbench/Catch-v0", setup.agent, seed=7)
    assert evaluator.evaluate(first.policy_numpy(), episodes=50) == [1.0] * 50


@pytest.mark.slow
def test_anakin_refuses_an_env_that_is_not_jax(cluster):
    import workbench as wb
    from workbench.engine import train

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
    from workbench.envs import make_jax
    from workbench.learn.evaluation import GreedyEvaluator

    plan = plan_run(TrainConfig(env="workbench/CartPole-v1"))
    agent = plan.agent(1)
    compiled_way = GreedyEvaluator("workbench/CartPole-v1", agent, seed=0,
                                   jax_env=lambda: make_jax("workbench/CartPole-v1"))
    stepped_way = GreedyEvaluator("workbench/CartPole-v1", agent, seed=0)
    built = agent.build()
    params, stats = jax.tree.map(np.asarray, built.policy(built.init(jax.random.PRNGKey(0))))
    # A policy that always pushes right: its episodes end within a few steps of each
    # other whatever the start state, so both ways of evaluating must agree closely.
    params["params"]["Dense_4"] = {"kernel": np.zeros((64, 2), np.float32),
                                   "bias": np.array([0.0, 1.0], np.float32)}
    compiled = np.array(compiled_way.evaluate((params, stats), 100))
    stepped = np.array(stepped_way.evaluate((params, stats), 100))
    assert compiled.shape == (100,) and set(np.unique(compiled)) <= set(range(7, 14))
    assert abs(compiled.mean() - stepped.mean()) < 0.5, (compiled.mean(), stepped.mean())


# -- a JAX environment of the user's own, registered as a notebook cell would -------------

@dataclass(frozen=True)
class Corridor:
    """Walk right (action 1) along a corridor to its last cell for a reward of 1; every
    episode is cut off after twice the corridor's length."""

    length: int = 6

    num_actions: ClassVar[int] = 2

    @property
    def id(self) -> str:
        return "test/Corridor-v0"

    @property
    def observation_shape(self) -> tuple[int, ...]:
        return (self.length,)

    @property
    def max_episode_steps(self) -> int:
        return 2 * self.length

    def reset(self, key):
        import jax.numpy as jnp

        position = jnp.zeros((), jnp.int32)
        return (position, jnp.zeros((), jnp.int32)), jax.nn.one_hot(position, self.length)

    def step(self, state, action, key):
        import jax.numpy as jnp

        position, t = state
        position = jnp.clip(position + 2 * action - 1, 0, self.length - 1)
        t = t + 1
        terminated = position == self.length - 1
        truncated = (t >= self.max_episode_steps) & ~terminated
        reward = jnp.where(terminated, 1.0, 0.0).astype(jnp.float32)
        return (position, t), jax.nn.one_hot(position, self.length), reward, terminated, \
            truncated

    def render(self, state):
        image = np.full((10, 10 * self.length, 3), 255, np.uint8)
        image[:, 10 * int(state[0]):10 * int(state[0]) + 10] = 0
        return image


@pytest.mark.slow
def test_a_jax_env_registered_by_the_user_trains_in_anakin_mode(cluster):
    import workbench as wb
    from workbench.engine import train

    wb.envs.register("test/Corridor-v0", Corridor, reward_threshold=0.95, replace=True)
    assert "test/Corridor-v0" in wb.envs.jax_env_ids()
    assert wb.envs.target_return("test/Corridor-v0") == 0.95
    config = TrainConfig(env="test/Corridor-v0", mode="anakin", total_env_steps=300_000,
                         stop_at_target=True, eval_every=0, seed=0)
    with wb.reserve("v6e", "2x2", timeout_s=60, cpus_per_chip=2) as tpu_slice:
        result = train(tpu_slice, config)
    assert result.target_return == 0.95 and result.time_to_train_target_s is not None
    assert result.final_return >= 0.95
    # Its gymnasium view works too, under the same id.
    import gymnasium as gym

    env = gym.make("test/Corridor-v0")
    obs, _ = env.reset(seed=0)
    assert obs.shape == (6,) and env.spec.reward_threshold == 0.95


def test_stop_at_target_needs_a_target_and_names_the_env():
    import workbench as wb

    wb.envs.register("test/Untargeted-v0", Corridor, replace=True)
    with pytest.raises(ValueError) as error:
        plan_run(TrainConfig(env="test/Untargeted-v0", mode="anakin", stop_at_target=True))
    assert "test/Untargeted-v0 has no reward_threshold" in str(error.value)
    assert "target_return" in str(error.value)
    # Without stop_at_target it runs without a target, and says so in its plan.
    assert plan_run(TrainConfig(env="test/Untargeted-v0", mode="anakin")).target_return is None
