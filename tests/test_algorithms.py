"""The algorithms' math on small hand-checked arrays, against the libraries of the field
where they have the same function (distrax's distributions, rlax's V-trace), and each
algorithm learning in one process."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from workbench.algos.base import LOCAL
from workbench.algos.distributions import Categorical, DiagGaussian, SquashedGaussian
from workbench.algos.impala.agent import vtrace
from workbench.algos.normalize import init_stats, update_stats
from workbench.algos.pqn.agent import q_lambda_returns


def test_distributions_agree_with_distrax():
    import distrax
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(5, 3)), jnp.float32)
    actions = jnp.asarray([0, 2, 1, 1, 0])
    ours, theirs = Categorical(logits), distrax.Categorical(logits=logits)
    np.testing.assert_allclose(ours.log_prob(actions), theirs.log_prob(actions), rtol=1e-5)
    np.testing.assert_allclose(ours.entropy(), theirs.entropy(), rtol=1e-5)
    mean = jnp.asarray(rng.normal(size=(5, 2)), jnp.float32)
    log_std = jnp.asarray(rng.normal(size=(5, 2)) * 0.3, jnp.float32)
    x = jnp.asarray(rng.normal(size=(5, 2)), jnp.float32)
    gauss = distrax.MultivariateNormalDiag(mean, jnp.exp(log_std))
    np.testing.assert_allclose(DiagGaussian(mean, log_std).log_prob(x), gauss.log_prob(x),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(DiagGaussian(mean, log_std).entropy(), gauss.entropy(),
                               rtol=1e-5)
    # Squashed into [-2, 2]: the density of the action, through tanh and a scale of 2.
    low, high = -2.0 * jnp.ones(2), 2.0 * jnp.ones(2)
    squashed = distrax.Transformed(
        gauss, distrax.Block(distrax.Chain([distrax.ScalarAffine(0.0, 2.0), distrax.Tanh()]), 1))
    action = SquashedGaussian(mean, log_std, low, high).to_action(x)
    np.testing.assert_allclose(SquashedGaussian(mean, log_std, low, high).log_prob(x),
                               squashed.log_prob(action), rtol=1e-4, atol=1e-4)


def test_vtrace_agrees_with_rlax_on_every_column():
    import rlax
    rng = np.random.default_rng(1)
    T, N = 9, 4
    values = rng.normal(size=(T, N)).astype(np.float32)
    last_value = rng.normal(size=N).astype(np.float32)
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    discounts = (0.99 * (rng.random((T, N)) > 0.2)).astype(np.float32)
    log_rhos = (rng.normal(size=(T, N)) * 0.5).astype(np.float32)
    ours = vtrace(jnp.asarray(values), jnp.asarray(last_value), jnp.asarray(rewards),
                  jnp.asarray(discounts), jnp.asarray(log_rhos), lambda_=0.9, rho_bar=1.0,
                  c_bar=1.0, pg_rho_bar=1.0)
    for n in range(N):
        v_t = np.concatenate([values[1:, n], last_value[n:n + 1]])
        theirs = rlax.vtrace_td_error_and_advantage(
            values[:, n], v_t, rewards[:, n], discounts[:, n], np.exp(log_rhos[:, n]),
            lambda_=0.9, clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0)
        np.testing.assert_allclose(ours.vs[:, n], theirs.errors + values[:, n], rtol=1e-4,
                                   atol=1e-4)
        np.testing.assert_allclose(ours.pg_advantages[:, n], theirs.pg_advantage, rtol=1e-4,
                                   atol=1e-4)


def q_lambda_by_hand(rewards, next_q, terminated, truncated, gamma, lam):
    T, N = rewards.shape
    out = np.zeros((T, N))
    for n in range(N):
        carry = next_q[-1, n]
        for t in reversed(range(T)):
            if terminated[t, n]:
                carry = rewards[t, n]
            elif truncated[t, n]:
                carry = rewards[t, n] + gamma * next_q[t, n]
            else:
                carry = rewards[t, n] + gamma * ((1 - lam) * next_q[t, n] + lam * carry)
            out[t, n] = carry
    return out


def test_q_lambda_returns_match_a_plain_loop():
    rng = np.random.default_rng(2)
    T, N = 11, 3
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    next_q = rng.normal(size=(T, N)).astype(np.float32)
    terminated = rng.random((T, N)) < 0.15
    truncated = (rng.random((T, N)) < 0.1) & ~terminated
    got = q_lambda_returns(jnp.asarray(rewards), jnp.asarray(next_q), jnp.asarray(terminated),
                           jnp.asarray(truncated), 0.97, 0.65)
    want = q_lambda_by_hand(rewards, next_q, terminated, truncated, 0.97, 0.65)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_running_statistics_fold_batches_exactly():
    rng = np.random.default_rng(3)
    data = rng.normal(loc=3.0, scale=2.0, size=(300, 4)).astype(np.float32)
    stats = init_stats((4,))
    for chunk in np.split(data, 3):
        stats = update_stats(stats, jnp.asarray(chunk), LOCAL)
    np.testing.assert_allclose(stats.mean, data.mean(0), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(stats.var, data.var(0), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("algo", ["ppo", "impala", "pqn"])
def test_a_trained_policy_reads_back_in_a_process_without_jax(algo):
    """What a run hands its notebook (its final policy, on the host) unpickles without
    importing JAX, so the kernel stays as light as a plain Ray driver."""
    import pickle
    import subprocess
    import sys

    import jax

    from workbench.engine import TrainConfig
    from workbench.engine.plan import plan_run
    from workbench.learn.learner import to_numpy

    agent = plan_run(TrainConfig(env="CartPole-v1", algo=algo)).agent(1).build()
    policy = pickle.dumps(to_numpy(agent.policy(agent.init(jax.random.key(0)))))
    read_back = subprocess.run(
        [sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read()); "
         "print(sorted(m for m in ('jax', 'jaxlib', 'flax', 'optax') if m in sys.modules))"],
        input=policy, capture_output=True, timeout=60)
    assert read_back.returncode == 0, read_back.stderr.decode()[-2000:]
    assert read_back.stdout.decode().strip() == "[]"


def test_the_picker_offers_rllib_as_an_engine_and_builds_its_config():
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.algorithms.sac import SACConfig

    from workbench.ui import AlgorithmPicker

    picker = AlgorithmPicker(engine="rllib", algo="ppo", env="CartPole-v1", seed=3)
    assert picker.algo_dropdown.options == ("APPO", "DQN", "IMPALA", "PPO", "SAC")
    assert picker.algo_dropdown.value == "PPO" and picker.mode_dropdown.disabled
    assert {"lr", "num_epochs", "num_env_runners"} <= set(picker._boxes)
    picker.select(lr=1e-3, num_env_runners=4)
    config = picker.config()
    assert isinstance(config, PPOConfig)
    assert (config.lr, config.num_env_runners, config.seed, config.env) == (
        1e-3, 4, 3, "CartPole-v1")
    assert config.num_learners == 0  # one learner per chip of the slice it trains on
    assert config.num_epochs == PPOConfig().num_epochs  # untouched boxes keep RLlib's own
    picker.select(algo="SAC", env="Pendulum-v1")
    assert "actor_lr" in picker._boxes and "num_epochs" in picker._boxes
    assert isinstance(picker.config(), SACConfig)
    with pytest.raises(ValueError, match="clip_param"):
        picker.select(clip_param=0.1)  # PPO's, not SAC's
    # Back to the JAX engine: its own algorithms and a TrainConfig.
    picker.engine_dropdown.value = "jax"
    assert picker.algo_dropdown.value == "ppo" and not picker.mode_dropdown.disabled
    assert type(picker.config()).__name__ == "TrainConfig"
    with pytest.raises(ValueError, match="learns from recorded data"):
        AlgorithmPicker(engine="rllib", algo="BC")


def test_the_algorithm_picker_builds_the_run_config_from_its_boxes():
    from workbench.algos.impala import IMPALAConfig
    from workbench.ui import AlgorithmPicker

    picker = AlgorithmPicker(algo="ppo", total_env_steps=4096, seed=3)
    assert {"ppo", "impala", "pqn"} <= set(picker.algo_dropdown.options)
    assert "learning_rate" in picker._boxes and "clip_eps" in picker._boxes
    # Choosing another algorithm shows its fields instead.
    picker.select(algo="impala", mode="actors", env="Pendulum-v1")
    assert "vtrace_lambda" in picker._boxes and "clip_eps" not in picker._boxes
    picker._boxes["learning_rate"].value = 1e-3
    picker._boxes["hidden_sizes"].value = "32,32"
    config = picker.config(policy_lag=2)
    assert isinstance(config.algo_config, IMPALAConfig)
    assert (config.algo, config.env, config.policy_lag, config.seed) == ("impala", "Pendulum-v1",
                                                                         2, 3)
    assert config.algo_config.learning_rate == 1e-3
    assert config.algo_config.hidden_sizes == (32, 32)
    # A box that cannot work is named, in the exception and in the picker.
    picker._boxes["learning_rate"].value = -1.0
    with pytest.raises(ValueError, match="learning_rate"):
        picker.config()
    assert "learning_rate" in picker.status.value
    with pytest.raises(ValueError, match="clip_eps"):
        picker.select(clip_eps=0.1)
    # PQN handles discrete actions only: Pendulum is refused when the run is planned.
    picker.select(algo="pqn")
    assert "discrete" in picker.summary.value
