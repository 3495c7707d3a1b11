"""The algorithms and the environment suites: each learns (in one process, where a run is
cheap enough to go to a bar), and each runs on a simulated v6e 2x2 of the session cluster
(short runs: every chip ends with the same state). PPO with a Gaussian policy on Pendulum,
PQN, gymnax's MinAtar and brax in Anakin mode, env keyword arguments and wrappers in actors
mode, and an env registered only in the driver reaching the rollout actors. IMPALA with
rollout actors two updates ahead runs on the slice in notebooks/09_algorithms.ipynb.

The full bars (against RLlib, over several seeds) are ``benchmarks/bench_algorithms.py``'s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest

from workbench.algos.ppo import PPOConfig
from workbench.engine import TrainConfig, train
from workbench.engine.in_process import train_in_process
from workbench.engine.plan import plan_run

# PPO's settings for Pendulum (what benchmarks/bench_algorithms.py uses too): a short
# horizon, many epochs, normalised observations and scaled rewards.
PENDULUM_PPO = PPOConfig(learning_rate=1e-3, gamma=0.9, num_epochs=10, num_minibatches=32,
                         normalize_observations=True, scale_rewards=True, ent_coef=0.0)
PENDULUM = dict(env="Pendulum-v1", algo_config=PENDULUM_PPO, envs_per_chip=4,
                rollout_length=128, eval_every=0, eval_episodes=5)


def _last_100(curve: list[dict]) -> float:
    return curve[-1]["mean_return_100"]


def _one_state(result) -> None:
    assert len(result.chip_state_digests) == 4 and len(set(result.chip_state_digests)) == 1


# ---- learning, in one process -----------------------------------------------------------

@pytest.mark.slow
def test_ppo_with_a_gaussian_policy_learns_pendulum():
    done = train_in_process(TrainConfig(**PENDULUM, total_env_steps=200_000, seed=0), chips=4)
    # A random policy scores about -1200; the benchmark's bar over 300k steps is -250.
    assert _last_100(done.curve) > -500, done.curve[-1]


@pytest.mark.slow
def test_impala_learns_cartpole_from_batches_two_versions_old():
    config = TrainConfig(env="CartPole-v1", algo="impala", policy_lag=2,
                         total_env_steps=200_000, eval_every=0, seed=0)
    done = train_in_process(config, chips=4, evaluate=False)
    assert _last_100(done.curve) > 200, done.curve[-1]
    # The first two updates learn from the starting policy's batches, the rest from
    # batches made by the policy exactly two versions before.
    assert done.policy_versions[:3] == [[0], [0], [0]]
    assert all(v == [u - 2] for u, v in enumerate(done.policy_versions) if u >= 2)


@pytest.mark.slow
def test_pqn_reaches_cartpoles_target_in_anakin_mode():
    config = TrainConfig(env="workbench/CartPole-v1", mode="anakin", algo="pqn",
                         total_env_steps=500_000, stop_at_target=True, seed=0)
    done = train_in_process(config, chips=4)
    assert done.train_target is not None and done.final_return >= 400


@pytest.mark.slow
def test_minatar_from_gymnax_learns_in_anakin_mode():
    config = TrainConfig(env="gymnax:Breakout-MinAtar", mode="anakin", envs_per_chip=64,
                         rollout_length=32, total_env_steps=150_000, eval_every=0, seed=0)
    done = train_in_process(config, evaluate=False)
    returns = [r["mean_return_this_update"] for r in done.curve
               if r["mean_return_this_update"] is not None]
    # Breakout-MinAtar: a random policy breaks about one brick an episode.
    assert np.mean(returns[:5]) < 2.0 and np.mean(returns[-5:]) > 2 * np.mean(returns[:5])


# ---- on the slice -------------------------------------------------------------------------

@pytest.mark.slow
def test_continuous_actions_and_brax_on_the_slice(two_by_two):
    result = train(two_by_two, TrainConfig(**PENDULUM, total_env_steps=3 * 4 * 4 * 128))
    assert result.updates == 3 and result.target_return is None  # Pendulum has none
    _one_state(result)
    # Pendulum has no vectorised form: an actor per chip, as far as this machine's cores
    # (shared by the simulated host's four learners) go.
    spare = len(os.sched_getaffinity(0)) - 4
    assert result.rollout_actors_per_host == max(n for n in (1, 2, 4) if n <= max(1, spare))
    # brax across the slice's processes: its loader puts the model on jax.devices()[0],
    # which only rank 0 can address, unless the adapter keeps it on each rank's own chip.
    # Gradient sync: the mode whose per-chip typing brax's solver does not pass.
    result = train(two_by_two, TrainConfig(
        env="brax:inverted_pendulum", mode="anakin", sync="gradients", envs_per_chip=8,
        rollout_length=32,
        total_env_steps=3 * 4 * 8 * 32, eval_every=0, eval_episodes=2,
        env_kwargs={"episode_length": 100},
        algo_config=PPOConfig(normalize_observations=True)))
    assert result.updates == 3 and result.env == "brax:inverted_pendulum"
    assert all(np.isfinite(row["loss"]) for row in result.curve)
    _one_state(result)


@pytest.mark.slow
def test_pqn_and_minatar_in_anakin_mode_on_the_slice(two_by_two):
    for env, algo in (("workbench/CartPole-v1", "pqn"), ("gymnax:Breakout-MinAtar", "ppo")):
        result = train(two_by_two, TrainConfig(
            env=env, mode="anakin", algo=algo, envs_per_chip=8, rollout_length=32,
            total_env_steps=3 * 4 * 8 * 32, eval_every=0, eval_episodes=2))
        assert result.updates == 3 and result.env == env and result.algo == algo
        assert all(np.isfinite(row["loss"]) for row in result.curve)
        _one_state(result)


class LineEnv(gym.Env):
    """Walk right along a line of 5 cells (registered only in the test's process)."""

    observation_space = gym.spaces.Box(0.0, 1.0, (5,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position, self.t = 0, 0
        return self._obs(), {}

    def _obs(self):
        obs = np.zeros(5, np.float32)
        obs[self.position] = 1.0
        return obs

    def step(self, action):
        self.position = int(np.clip(self.position + (1 if action == 1 else -1), 0, 4))
        self.t += 1
        done = self.position == 4
        return self._obs(), float(done), done, self.t >= 20 and not done, {}


@pytest.mark.slow
def test_env_kwargs_wrappers_and_an_env_registered_only_here_reach_the_actors(two_by_two):
    if "test/Line-v0" not in gym.registry:
        gym.register("test/Line-v0", entry_point=LineEnv)
    small = dict(envs_per_chip=4, rollout_length=32, total_env_steps=2 * 4 * 4 * 32,
                 eval_every=0, eval_episodes=2)
    result = train(two_by_two, TrainConfig(env="test/Line-v0", **small))
    assert result.updates == 2 and result.curve[-1]["episodes"] > 0
    # Keyword arguments and wrappers as given: Sutton and Barto's CartPole pays -1 at the
    # end and 0 before, and the time-aware observation has a fifth component.
    config = TrainConfig(env="CartPole-v1", env_kwargs={"sutton_barto_reward": True},
                         wrappers=("TimeAwareObservation",), **small)
    assert plan_run(config).spaces.obs_shape == (5,)
    result = train(two_by_two, config)
    returns = [r["mean_return_this_update"] for r in result.curve
               if r["mean_return_this_update"] is not None]
    assert returns and all(r <= 0 for r in returns), returns


def test_unsupported_combinations_are_refused_naming_what_is_supported():
    with pytest.raises(ValueError, match="continuous actions, and pqn handles discrete"):
        plan_run(TrainConfig(env="Pendulum-v1", algo="pqn"))
    with pytest.raises(ValueError, match="trains in mode='anakin'"):
        plan_run(TrainConfig(env="gymnax:CartPole-v1"))
    with pytest.raises(ValueError, match="Anakin mode steps JAX environments"):
        plan_run(TrainConfig(env="Acrobot-v1", mode="anakin"))
    with pytest.raises(ValueError, match="gymnax has no environment 'Nope-v0'"):
        plan_run(TrainConfig(env="gymnax:Nope-v0", mode="anakin"))


def test_a_missing_suite_names_the_extra_to_install():
    code = textwrap.dedent("""
        import sys
        sys.modules["gymnax"] = None  # as if the extra were not installed
        from workbench.engine import TrainConfig
        from workbench.engine.plan import plan_run
        try:
            plan_run(TrainConfig(env="gymnax:Breakout-MinAtar", mode="anakin"))
        except ValueError as error:
            print(error)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert "pip install 'tpu-rl-workbench[envs]'" in done.stdout, done.stdout + done.stderr
