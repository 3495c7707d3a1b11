"""The workbench's own environments: the JAX contract, parity with gymnasium's CartPole,
the bsuite tasks' optimal returns, the gymnasium views and the animations. No Ray cluster."""

from __future__ import annotations

import subprocess
import sys
import warnings

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from PIL import Image

from workbench.envs import JaxEnv, episode_frames, jax_env_ids, make_jax, save_gif
from workbench.envs.cartpole import CartPoleState
from workbench.envs.gym_view import JaxGymEnv, JaxVectorEnv, compiled

IDS = ["workbench/CartPole-v1", "workbench/Catch-v0", "workbench/DeepSea-v0"]


def balance(obs) -> int:
    """Push towards the side the pole falls to; keeps CartPole up for 500 steps."""
    return int(obs[2] + 0.5 * obs[3] > 0)


# ---------------------------------------------------------------- the registry and contract


def test_every_env_id_builds_an_env_that_follows_the_contract():
    # Other tests of the session register environments of their own beside these.
    assert [i for i in jax_env_ids() if i.startswith("workbench/")] == IDS
    for env_id in IDS:
        env = make_jax(env_id)
        assert isinstance(env, JaxEnv) and env.id == env_id
        assert env.num_actions >= 2 and env.max_episode_steps >= 1
        assert make_jax(env_id) == env and hash(make_jax(env_id)) == hash(env)


def test_unknown_ids_and_parameters_are_refused_with_the_valid_choices():
    with pytest.raises(ValueError, match="workbench/Catch-v0") as info:
        make_jax("CartPole-v1")
    assert "Did you mean 'workbench/CartPole-v1'" in str(info.value)
    with pytest.raises(ValueError, match="its parameters are size, mapping_seed"):
        make_jax("workbench/DeepSea-v0", sise=5)
    with pytest.raises(ValueError, match="size=1 was asked"):
        make_jax("workbench/DeepSea-v0", size=1)
    with pytest.raises(ValueError, match="only 'rgb_array'"):
        JaxGymEnv("workbench/Catch-v0", render_mode="ansi")


@pytest.mark.parametrize("env_id", IDS)
def test_reset_and_step_jit_and_vmap_over_a_batch(env_id):
    env, n = make_jax(env_id), 8
    keys = jax.random.split(jax.random.key(1), n)
    states, obs = jax.jit(jax.vmap(env.reset))(keys)
    assert obs.shape == (n, *env.observation_shape) and obs.dtype == jnp.float32
    assert all(leaf.shape == (n,) for leaf in jax.tree.leaves(states))
    actions = jnp.arange(n) % env.num_actions
    states, obs, reward, terminated, truncated = jax.jit(jax.vmap(env.step))(
        states, actions, keys
    )
    assert obs.shape == (n, *env.observation_shape) and obs.dtype == jnp.float32
    assert reward.shape == (n,) and reward.dtype == jnp.float32
    assert terminated.shape == truncated.shape == (n,)
    assert terminated.dtype == truncated.dtype == jnp.bool_
    assert all(leaf.shape == (n,) for leaf in jax.tree.leaves(states))
    assert np.all(np.asarray(states.t) == 1)


# ---------------------------------------------------------------- CartPole against gymnasium


def _to_gym_state(state: CartPoleState) -> np.ndarray:
    return np.array([state.x, state.x_dot, state.theta, state.theta_dot], dtype=np.float64)


def test_cartpole_matches_gymnasium_for_500_steps_of_short_episodes():
    """Free-running: both start from the same state and get the same actions.

    NOTE: float32 here against float64 there differ by ~1e-7 a step, and the upright pole
    is unstable: the gap grows about 10x every 25 steps of one episode (measured: 1e-7 at
    50 steps, 8e-6 at 100, 4e-4 at 150). Random actions end episodes within tens of steps,
    and each new episode starts both from the same state again, so 1e-5 is honest here;
    the full-length episode is checked step by step in the next test.
    """
    env = make_jax("workbench/CartPole-v1")
    fns = compiled(env)
    reference = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    key = jax.random.key(0)

    def start():
        nonlocal key
        key, state, obs = fns.reset(key)
        reference.reset(seed=int(rng.integers(1000)))  # clears its time limit and flags
        reference.unwrapped.state = _to_gym_state(state)
        np.testing.assert_array_equal(np.asarray(obs), reference.unwrapped.state.astype("f4"))
        return state

    state, episodes, lengths, length = start(), 0, [], 0
    for _ in range(500):
        action = int(rng.integers(2))
        key, state, obs, reward, terminated, truncated = fns.step(key, state, np.int32(action))
        ref_obs, ref_reward, ref_terminated, ref_truncated, _ = reference.step(action)
        length += 1
        np.testing.assert_allclose(np.asarray(obs), ref_obs, rtol=0, atol=1e-5)
        assert float(reward) == ref_reward == 1.0
        assert bool(terminated) == ref_terminated
        assert bool(truncated) == (ref_truncated and not ref_terminated)
        if ref_terminated or ref_truncated:
            episodes, lengths, length = episodes + 1, lengths + [length], 0
            state = start()
    assert episodes >= 10, lengths


def test_cartpole_dynamics_and_time_limit_match_gymnasium_over_a_full_episode():
    """Step by step along a 500-step balanced episode: at every step the JAX env starts
    from gymnasium's state (rounded to float32) and its own step counter, so the one-step
    dynamics, both flags and the truncation at step 500 are compared without the drift."""
    env = make_jax("workbench/CartPole-v1")
    step = jax.jit(env.step)
    reference = gym.make("CartPole-v1")
    reference.reset(seed=3)
    key, t, steps = jax.random.key(0), jnp.zeros((), jnp.int32), 0
    truncated = terminated = False
    while True:
        physics = reference.unwrapped.state.astype(np.float32)
        state = CartPoleState(*physics, t=t)
        action = balance(physics)
        state, obs, reward, terminated, truncated = step(state, action, key)
        ref_obs, ref_reward, ref_terminated, ref_truncated, _ = reference.step(action)
        t, steps = state.t, steps + 1
        np.testing.assert_allclose(np.asarray(obs), ref_obs, rtol=0, atol=1e-5)
        assert float(reward) == ref_reward
        assert bool(terminated) == ref_terminated
        assert bool(truncated) == (ref_truncated and not ref_terminated)
        if ref_terminated or ref_truncated:
            break
    assert steps == 500 and bool(truncated) and not bool(terminated)


def test_cartpole_start_states_are_uniform_in_the_gymnasium_range():
    env = make_jax("workbench/CartPole-v1")
    _, obs = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.key(0), 2000))
    obs = np.asarray(obs)
    assert obs.min() >= -0.05 and obs.max() <= 0.05
    # Uniform, not clustered: each quarter of the range holds about a quarter of the draws.
    quarters = np.histogram(obs, bins=4, range=(-0.05, 0.05))[0] / obs.size
    np.testing.assert_allclose(quarters, 0.25, atol=0.03)


# ---------------------------------------------------------------- Catch and DeepSea


def _catch_returns(policy, episodes: int = 200):
    env = make_jax("workbench/Catch-v0")

    def episode(key):
        state, obs = env.reset(key)

        def body(carry, _):
            state, obs = carry
            state, obs, reward, terminated, _ = env.step(state, policy(obs), key)
            return (state, obs), (reward, terminated)

        (_, _), (rewards, terminated) = jax.lax.scan(
            body, (state, obs), None, length=env.max_episode_steps
        )
        return rewards.sum(), terminated, state.ball_col

    keys = jax.random.split(jax.random.key(0), episodes)
    return [np.asarray(x) for x in jax.jit(jax.vmap(episode))(keys)]


def _follow_the_ball(obs):
    ball = jnp.argmax(obs[:-1].sum(axis=0))
    paddle = jnp.argmax(obs[-1])
    return jnp.sign(ball - paddle) + 1


def test_catch_a_paddle_that_follows_the_ball_always_catches_it():
    returns, terminated, start_columns = _catch_returns(_follow_the_ball)
    np.testing.assert_array_equal(returns, 1.0)
    # Every episode ends exactly when the ball reaches the bottom row, after 9 steps.
    assert terminated[:, -1].all() and not terminated[:, :-1].any()
    assert set(start_columns.tolist()) == {0, 1, 2, 3, 4}


def test_catch_a_paddle_that_stays_put_misses_most_balls():
    returns, _, start_columns = _catch_returns(lambda obs: jnp.int32(1))
    np.testing.assert_array_equal(returns, np.where(start_columns == 2, 1.0, -1.0))
    assert returns.mean() < 0


def test_deepsea_only_the_all_right_path_gets_the_reward():
    env = make_jax("workbench/DeepSea-v0")
    n = env.size
    sequences = (np.arange(2**n)[:, None] >> np.arange(n)) & 1  # every action sequence

    def play(actions):
        state, _ = env.reset(jax.random.key(0))

        def body(state, action):
            state, obs, reward, terminated, truncated = env.step(state, action, jax.random.key(0))
            return state, (reward, terminated, truncated)

        _, out = jax.lax.scan(body, state, actions)
        return out

    rewards, terminated, truncated = (np.asarray(x) for x in jax.jit(jax.vmap(play))(sequences))
    returns = rewards.sum(axis=1)
    best = int(np.flatnonzero((sequences == env.optimal_actions()).all(axis=1))[0])
    np.testing.assert_allclose(returns[best], 1 - 0.01, atol=1e-6)
    assert np.delete(returns, best).max() <= 0.0
    assert terminated[:, -1].all() and not terminated[:, :-1].any() and not truncated.any()
    # The meaning of the actions changes between cells, so no constant action is optimal.
    assert set(env.optimal_actions().tolist()) == {0, 1}


# ---------------------------------------------------------------- the gymnasium views


@pytest.mark.parametrize("env_id", IDS)
def test_gymnasium_views_pass_the_env_checker(env_id):
    env = gym.make(env_id, render_mode="rgb_array")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    # CartPole's velocities are unbounded, exactly as in gymnasium's own observation space.
    allowed = "observation space m" if env_id.endswith("CartPole-v1") else "\0"
    assert [str(w.message) for w in caught if allowed not in str(w.message)] == []
    assert env.observation_space.shape == make_jax(env_id).observation_shape
    assert env.action_space == gym.spaces.Discrete(make_jax(env_id).num_actions)


@pytest.mark.parametrize("env_id", IDS)
def test_rendered_frames_are_small_rgb_images_that_follow_the_state(env_id):
    env = gym.make(env_id, render_mode="rgb_array")
    env.reset(seed=0)
    first = env.render()
    assert first.dtype == np.uint8 and first.ndim == 3 and first.shape[2] == 3
    assert max(first.shape[:2]) <= 200
    for _ in range(5):
        _, _, terminated, truncated, _ = env.step(1)
        assert not (terminated or truncated)
    assert env.render().shape == first.shape
    assert not np.array_equal(env.render(), first)


def test_a_view_refuses_steps_it_cannot_take():
    env = JaxGymEnv("workbench/Catch-v0")
    with pytest.raises(gym.error.ResetNeeded):
        env.step(1)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="0..2"):
        env.step(3)
    for _ in range(9):
        env.step(1)
    with pytest.raises(gym.error.ResetNeeded):
        env.step(1)


def test_the_batched_view_replays_a_loop_over_single_views():
    env_id = "workbench/CartPole-v1"
    batched = gym.make_vec(env_id, 4, vectorization_mode="vector_entry_point")
    looped = gym.make_vec(env_id, 4, vectorization_mode="sync")
    assert isinstance(batched.unwrapped, JaxVectorEnv)
    obs_a, _ = batched.reset(seed=7)
    obs_b, _ = looped.reset(seed=7)
    np.testing.assert_array_equal(obs_a, obs_b)
    rng, ended = np.random.default_rng(0), 0
    for _ in range(60):
        actions = rng.integers(2, size=4)
        a, b = batched.step(actions), looped.step(actions)
        np.testing.assert_allclose(a[0], b[0], rtol=0, atol=1e-6)
        for x, y in zip(a[1:4], b[1:4], strict=True):
            np.testing.assert_array_equal(x, y)
        ended += int((a[2] | a[3]).sum())
    assert ended >= 4  # the autoreset path was taken, and matched


def test_rollout_vector_envs_use_the_batched_view_with_next_step_autoreset():
    from workbench.learn.rollout import make_vector_env

    envs = make_vector_env("workbench/CartPole-v1", 4, seed=0)
    assert isinstance(envs, JaxVectorEnv)
    envs.reset(seed=0)
    done_before = np.zeros(4, dtype=bool)
    restarts = 0
    for _ in range(40):
        obs, reward, terminated, truncated, _ = envs.step(np.ones(4, dtype=np.int64))
        # The step after an episode ends is that env's reset: reward 0, a fresh start state.
        assert np.all(reward[done_before] == 0.0) and np.all(reward[~done_before] == 1.0)
        assert np.all(np.abs(obs[done_before]) <= 0.05)
        restarts += int(done_before.sum())
        done_before = terminated | truncated
    assert restarts >= 4


def test_gymnasium_finds_the_ids_in_a_fresh_process():
    code = (
        "import gymnasium as gym\n"
        "try:\n"
        "    gym.make('workbench/Catch-v0')\n"
        "    raise SystemExit('registered before any import of workbench')\n"
        "except gym.error.NamespaceNotFound:\n"
        "    pass\n"
        "import workbench\n"
        "obs, _ = gym.make('workbench/DeepSea-v0', size=4).reset(seed=0)\n"
        "print(obs.shape)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(4, 4)"


# ---------------------------------------------------------------- animations


def test_an_episode_becomes_a_gif_with_one_frame_per_state(tmp_path):
    frames = episode_frames("workbench/Catch-v0", lambda obs: _follow_the_ball(obs), seed=3)
    assert len(frames) == 10  # the start and nine steps
    path = save_gif(frames, tmp_path / "catch.gif", fps=10)
    with Image.open(path) as gif:
        assert gif.n_frames == 10 and gif.info["duration"] == 100
        decoded = []
        for i in range(gif.n_frames):
            gif.seek(i)
            decoded.append(np.asarray(gif.convert("RGB")))
    assert decoded[0].shape == frames[0].shape
    assert all(not np.array_equal(a, b) for a, b in zip(decoded[:-1], decoded[1:], strict=True))


def test_episode_frames_stop_at_the_end_of_an_episode_or_at_max_steps(tmp_path):
    capped = episode_frames("workbench/CartPole-v1", balance, seed=0, max_steps=20)
    assert len(capped) == 21
    fallen = episode_frames("workbench/CartPole-v1", lambda obs: 1, seed=0, max_steps=500)
    assert 2 < len(fallen) < 100  # always pushing right topples the pole early
    with pytest.raises(ValueError, match="same size"):
        save_gif([capped[0], capped[0][:50]], tmp_path / "mixed.gif")
