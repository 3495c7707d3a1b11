"""The PPO math on small hand-checked arrays, and one in-process learner."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from workbench.algos.ppo import Batch, PPOConfig, gae, ppo_loss


def gae_by_hand(rewards, values, terminated, truncated, last_value, gamma, lam):
    T, N = rewards.shape
    adv = np.zeros((T, N))
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            next_value = values[t + 1, n] if t + 1 < T else last_value[n]
            if terminated[t, n]:
                next_value = 0.0
            delta = rewards[t, n] + gamma * next_value - values[t, n]
            if terminated[t, n] or truncated[t, n]:
                running = 0.0
            running = delta + gamma * lam * running
            adv[t, n] = running
    return adv, adv + values


def test_gae_matches_a_plain_python_loop():
    rng = np.random.default_rng(0)
    T, N = 12, 3
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    values = rng.normal(size=(T, N)).astype(np.float32)
    terminated = rng.random((T, N)) < 0.15
    truncated = (rng.random((T, N)) < 0.1) & ~terminated
    last_value = rng.normal(size=N).astype(np.float32)
    adv, ret = gae(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(terminated),
                   jnp.asarray(truncated), jnp.asarray(last_value), 0.99, 0.95)
    want_adv, want_ret = gae_by_hand(rewards, values, terminated, truncated, last_value,
                                     0.99, 0.95)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)


def test_truncation_bootstraps_and_termination_does_not():
    rewards = jnp.ones((1, 2))
    values = jnp.zeros((1, 2))
    last_value = jnp.array([10.0, 10.0])
    adv, _ = gae(rewards, values, jnp.array([[True, False]]), jnp.array([[False, True]]),
                 last_value, 0.5, 1.0)
    assert adv.tolist() == [[1.0, 6.0]]


def _linear_apply(params, obs):
    from workbench.algos.distributions import Categorical

    logits = obs @ params["w"]
    return Categorical(logits), obs.sum(-1) * params["v"]


def test_masked_steps_do_not_change_the_loss():
    rng = np.random.default_rng(1)
    obs = jnp.asarray(rng.normal(size=(8, 3)), jnp.float32)
    params = {"w": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32), "v": jnp.float32(0.3)}
    batch = Batch(obs, jnp.asarray(rng.integers(0, 2, 8)), jnp.full(8, -0.7),
                  jnp.asarray(rng.normal(size=8), jnp.float32),
                  jnp.asarray(rng.normal(size=8), jnp.float32),
                  jnp.asarray([1, 1, 1, 1, 1, 1, 0, 0], jnp.float32))
    loss, _ = ppo_loss(params, _linear_apply, batch, PPOConfig())
    garbage = batch._replace(advantages=batch.advantages.at[6:].set(1e6),
                             returns=batch.returns.at[6:].set(-1e6))
    loss_garbage, _ = ppo_loss(params, _linear_apply, garbage, PPOConfig())
    assert float(loss) == pytest.approx(float(loss_garbage), rel=1e-6)


def test_clipping_stops_the_policy_gradient_beyond_the_trust_region():
    obs = jnp.ones((1, 3))
    params = {"w": jnp.zeros((3, 2)), "v": jnp.float32(0.0)}
    # The old policy gave the action log-prob -5 (ratio e^4.3 >> 1.2) and advantage > 0.
    batch = Batch(obs, jnp.array([0]), jnp.array([-5.0]), jnp.array([1.0]), jnp.array([0.0]),
                  jnp.array([1.0]))
    config = PPOConfig(normalize_advantages=False, ent_coef=0.0, vf_coef=0.0)
    grads = jax.grad(lambda p: ppo_loss(p, _linear_apply, batch, config)[0])(params)
    assert float(jnp.abs(grads["w"]).max()) == 0.0


def test_in_process_learner_steps_and_keeps_shapes():
    from workbench.engine import TrainConfig
    from workbench.engine.plan import plan_run
    from workbench.learn.actors_mode import BatchLearner, LocalSource
    from workbench.learn.rollout import RolloutWorker

    setup = plan_run(TrainConfig(env="CartPole-v1", envs_per_chip=4, rollout_length=32,
                                 total_env_steps=10 * 128)).learner_setup(1, "gradients")
    worker = RolloutWorker("CartPole-v1", num_envs=4, rollout_length=32, agent=setup.agent,
                           seed=0)
    agent = setup.agent.build()
    batch = worker.sample(jax.tree.map(np.asarray, agent.policy(agent.init(
        jax.random.PRNGKey(0)))), policy_version=0)
    trajectory = batch.trajectory
    assert trajectory.obs.shape == (32, 4, 4) and batch.policy_version == 0
    assert trajectory.last_obs.shape == (4, 4)
    assert set(trajectory.extras) == {"log_prob", "value"}
    # Every step after an episode end is the env's reset step and is masked out.
    ended = trajectory.terminated | trajectory.truncated
    assert not trajectory.valid[1:][ended[:-1]].any()

    learner = BatchLearner(setup, LocalSource([worker]))
    before = learner.state_leaves()
    result = learner.step()
    assert learner.update_count == 1 and np.isfinite(result.metrics["loss"])
    assert result.env_steps == 128 and result.policy_versions == (0,)
    after = learner.state_leaves()
    assert any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    learner.load_state_leaves(before, update=0)
    assert all(np.array_equal(a, b) for a, b in zip(before, learner.state_leaves(), strict=True))
    learner.finish()


def test_a_shared_rollout_splits_columns_and_episodes_between_learners():
    from workbench.engine import TrainConfig
    from workbench.engine.plan import plan_run
    from workbench.learn.rollout import RolloutWorker

    agent = plan_run(TrainConfig(env="CartPole-v1")).agent(1)
    worker = RolloutWorker("CartPole-v1", num_envs=6, rollout_length=40, agent=agent, seed=3)
    built = agent.build()
    acting = jax.tree.map(np.asarray, built.policy(built.init(jax.random.PRNGKey(0))))
    whole = worker.sample(acting, policy_version=4)
    parts = whole.split(3)
    assert [p.trajectory.obs.shape for p in parts] == [(40, 2, 4)] * 3
    assert [p.trajectory.last_obs.shape for p in parts] == [(2, 4)] * 3
    np.testing.assert_array_equal(
        np.concatenate([p.trajectory.rewards for p in parts], axis=1), whole.trajectory.rewards)
    np.testing.assert_array_equal(
        np.concatenate([p.trajectory.extras["value"] for p in parts], axis=1),
        whole.trajectory.extras["value"])
    assert sorted(r for p in parts for r in p.episode_returns) == sorted(whole.episode_returns)
    for p in parts:
        assert p.policy_version == 4 and all(0 <= e < 2 for e in p.episode_envs)
