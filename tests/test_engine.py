"""Training on simulated slices: learners pinned one per chip in one jax.distributed group,
and algorithms plugged in through the protocol."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import ray
from support.cluster_state import live_actor_names, live_actor_records, live_actors

import workbench as wb
from workbench.algos import DISCRETE, Agent, Algorithm
from workbench.algos import ppo as ppo_module
from workbench.algos.networks import ActorCritic
from workbench.engine import TrainConfig, checkpoint, train
from workbench.learn.evaluation import GreedyEvaluator

# 4 chips x 8 envs x 32 steps = 1024 env steps per update: 3 updates.
SMALL = dict(total_env_steps=3 * 1024, envs_per_chip=8, rollout_length=32, eval_every=1,
             eval_episodes=4)


def _digest(leaves) -> str:
    digest = hashlib.sha256()
    for leaf in leaves:
        digest.update(np.ascontiguousarray(leaf).tobytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def first_run(sim_cluster, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("ckpt"))
    with wb.reserve("v6e", "2x2", timeout_s=60, cpus_per_chip=2) as tpu_slice:
        result = train(tpu_slice, TrainConfig(seed=7, checkpoint_dir=directory, **SMALL))
    return result, directory


@pytest.fixture(scope="module")
def two_by_two(two_by_two):
    """The shared 2x2 (conftest.py) for the module's other runs: its learners and rollout
    actors started right after the reservation (as the slice picker does), then each run
    takes the ones the run before it kept warm."""
    wb.start_learners(two_by_two)
    return two_by_two


def _board_pid(tpu_slice) -> int:
    """The process of the slice's metrics board, which a slice keeping its learners keeps
    between runs."""
    (pid,) = [a["Pid"] for a in live_actor_records().values()
              if a.get("Name") == f"{tpu_slice.name}:board"]
    return pid


@pytest.mark.slow
def test_a_run_records_what_users_read(first_run):
    result, _ = first_run
    record = result.to_json()
    for key in ("env_steps", "wall_s", "final_return", "env_steps_per_s",
                "time_to_eval_target_s", "time_to_train_target_s", "startup_s", "generation",
                "topology", "chips", "hosts", "mode", "algo", "env", "sync", "seed",
                "target_return"):
        assert key in record
    assert (result.chips, result.hosts, result.updates) == (4, 1, 3)
    assert (result.algo, result.sync, result.target_return) == ("ppo", "batch", 475.0)
    # CartPole steps vectorised: one rollout actor serves the host's four chips.
    assert result.rollout_actors_per_host == 1
    # The rate a user reads: the run's steps over its loop's seconds (wall_s is rounded
    # to the millisecond, hence the tolerance).
    assert result.env_steps == 3 * 1024
    assert result.env_steps_per_s == pytest.approx(3 * 1024 / result.wall_s, rel=1e-2)
    assert [row["update"] for row in result.curve] == [1, 2, 3]
    assert all(len(row["chip_step_s"]) == 4 for row in result.curve)
    # The final return is the final policy's greedy evaluation (each one starts from the
    # same states, drawn from the run's seed): the same 4 episodes again here, on the CPU
    # as on the metrics board.
    with jax.default_device(jax.devices("cpu")[0]):
        again = GreedyEvaluator("CartPole-v1", result.agent, 7).evaluate(result.params, 4)
    assert len(again) == 4 and result.final_return == float(np.mean(again)), again
    assert set(result.startup_profile) == {"learners_joined_s", "learners_set_up_s",
                                           "compiled_s", "warm", "rollouts_warm"}
    assert result.startup_profile["warm"] is False
    assert result.startup_profile["rollouts_warm"] is False
    assert 0 < result.startup_profile["compiled_s"] <= result.startup_s
    # The slice kept its learners after the run; releasing it stopped them.
    assert live_actors() == []


@pytest.mark.slow
def test_every_chip_ends_with_the_same_state(first_run):
    result, _ = first_run
    assert len(result.chip_state_digests) == 4
    assert len(set(result.chip_state_digests)) == 1


@pytest.mark.slow
def test_the_final_checkpoint_holds_the_final_state(first_run):
    result, directory = first_run
    saved = checkpoint.restore(directory)
    assert (saved.update, saved.env_steps) == (3, 3 * 1024)
    assert _digest(saved.state) == result.chip_state_digests[0]


@pytest.mark.slow
def test_learners_warmed_for_a_run_at_reservation_train_it_as_new_ones_would(first_run,
                                                                              two_by_two):
    result, _ = first_run
    # Another free 2x2 of the session cluster (two_by_two holds one).
    with wb.reserve("v6e", "2x2", timeout_s=60, cpus_per_chip=2) as tpu_slice:
        before = set(live_actors())
        # A config that cannot work on the slice is refused before anything starts.
        with pytest.raises(ValueError, match="rollout_actors_per_host=3 does not divide"):
            wb.start_learners(tpu_slice, TrainConfig(rollout_actors_per_host=3))
        assert set(live_actors()) == before
        # Warmed for the run's config with another seed: the learners set up and compile
        # it, the rollout actors make its envs and policy; the run takes all of them.
        wb.start_learners(tpu_slice, TrainConfig(seed=99, **SMALL))
        warmed = train(tpu_slice, TrainConfig(seed=7, **SMALL))
    assert warmed.startup_profile["warm"] and warmed.startup_profile["rollouts_warm"]
    # Nothing of the warm-up leaks into the run: the first run's learning, on new processes.
    assert warmed.chip_state_digests == result.chip_state_digests
    assert [r["loss"] for r in warmed.curve] == [r["loss"] for r in result.curve]


@pytest.mark.slow
def test_same_seed_same_curve_and_resume_continues_exactly(first_run, two_by_two, tmp_path):
    result, directory = first_run
    # Resuming a finished run loads its state and has nothing left to do: the chips must
    # then hold exactly what the checkpoint holds.
    resumed = train(two_by_two, TrainConfig(seed=7, checkpoint_dir=directory, resume=True,
                                            **SMALL))
    board = _board_pid(two_by_two)
    # The same run again, on the learners and rollout actors the resumed run kept: the
    # same curve and state as the first run's fresh ones.
    again = train(two_by_two, TrainConfig(seed=7, checkpoint_dir=str(tmp_path), **SMALL))
    assert again.startup_profile["warm"] is True
    assert again.startup_profile["rollouts_warm"] is True
    # Its metrics board too (one process fewer to start), with nothing of the last run in
    # it: the curve below is the first run's.
    assert _board_pid(two_by_two) == board
    curve = [(r["episodes"], r["mean_return_this_update"], r["loss"]) for r in result.curve]
    assert curve == [(r["episodes"], r["mean_return_this_update"], r["loss"])
                     for r in again.curve]
    assert again.chip_state_digests == result.chip_state_digests
    assert resumed.updates == 3
    assert set(resumed.chip_state_digests) == {result.chip_state_digests[0]}
    # The resumed run was the slice's first: it took the processes started at reservation.
    assert resumed.startup_profile["warm"] and resumed.startup_profile["rollouts_warm"]


@pytest.mark.slow
def test_a_loss_defined_in_a_notebook_cell_trains_with_per_minibatch_all_reduce(two_by_two):
    def ppo_with_value_clip(params, apply_fn, batch, config):
        loss, metrics = ppo_module.ppo_loss(params, apply_fn, batch, config)
        extra = 0.01 * jnp.mean(jnp.square(apply_fn(params, batch.obs)[1]))
        return loss + extra, {**metrics, "value_penalty": extra}

    wb.algos.register(ppo_module.with_loss(ppo_with_value_clip), replace=True)
    small = dict(SMALL, total_env_steps=2 * 1024, eval_every=0)
    # A kept learner that died between runs: the run starts new ones instead.
    wb.start_learners(two_by_two)
    ray.kill(ray.get_actor(f"{two_by_two.name}:a0:learner-1"))
    ray.kill(ray.get_actor(f"{two_by_two.name}:board"))  # and the kept board: a new one
    result = train(two_by_two, TrainConfig(seed=1, algo="ppo_with_value_clip",
                                           sync="gradients", **small))
    assert result.startup_profile["warm"] is False
    assert (result.algo, result.sync) == ("ppo_with_value_clip", "gradients")
    assert all("value_penalty" in row for row in result.curve)
    # The other way of keeping chips equal: an all-reduce of gradients per minibatch.
    assert len(set(result.chip_state_digests)) == 1


@pytest.mark.slow
def test_kept_rollout_actors_are_replaced_when_dead_and_restarted_for_another_layout(
        two_by_two):
    small = dict(SMALL, total_env_steps=2 * 1024, eval_every=0)
    before = train(two_by_two, TrainConfig(seed=2, **small))
    # A kept rollout actor that died between runs: its keeper starts a new one, and the
    # run is the one it would have been.
    ray.kill(ray.get_actor(f"{two_by_two.name}:a0:rollout-0"))
    after = train(two_by_two, TrainConfig(seed=2, **small))
    assert after.startup_profile["warm"] and after.startup_profile["rollouts_warm"]
    assert after.chip_state_digests == before.chip_state_digests
    # Two rollout actors per host where one was kept: the kept one is stopped first (its
    # CPU is in a chip's bundle that a new one needs), and the run trains.
    split = train(two_by_two, TrainConfig(seed=2, rollout_actors_per_host=2, **small))
    assert split.startup_profile["warm"] and not split.startup_profile["rollouts_warm"]
    assert split.updates == 2
    rollouts = sorted(name for name in live_actor_names().values() if ":rollout-" in name)
    assert rollouts == [f"{two_by_two.name}:a0:rollout-{i}" for i in (0, 1)]


# -- an algorithm of the user's own, defined here as a notebook cell would ----------------

@dataclass(frozen=True)
class ReinforceConfig:
    """REINFORCE with a learned baseline."""

    learning_rate: float = 1e-2
    """Adam step size."""
    gamma: float = 0.99
    """Discount factor."""
    hidden_sizes: tuple[int, ...] = (32,)
    """MLP widths."""


def build_reinforce(config: ReinforceConfig, spaces, num_updates: int) -> Agent:
    import optax

    network = ActorCritic(spaces.num_actions, config.hidden_sizes)
    optimizer = optax.adam(config.learning_rate)

    def init(key):
        params = network.init(key, jnp.zeros((1, *spaces.obs_shape)))
        return params, optimizer.init(params)

    def act(params, obs, key):
        logits, _ = network.apply(params, obs)
        return jax.random.categorical(key, logits), {}

    def greedy(params, obs):
        return jnp.argmax(network.apply(params, obs)[0], axis=-1)

    def update(state, trajectory, key, chips):
        params, opt_state = state
        _, last_value = network.apply(params, trajectory.last_obs)

        def discounted(carry, step):
            reward, terminated, truncated, value = step
            carry = jnp.where(truncated, value, jnp.where(terminated, 0.0, carry))
            carry = reward + config.gamma * carry
            return carry, carry

        def loss(params):
            flat = trajectory.obs.reshape((-1, *spaces.obs_shape))
            logits, values = network.apply(params, flat)
            values = values.reshape(trajectory.rewards.shape)
            _, returns = jax.lax.scan(
                discounted, last_value,
                (trajectory.rewards, trajectory.terminated, trajectory.truncated,
                 jnp.concatenate([values[1:], last_value[None]])), reverse=True)
            returns = jax.lax.stop_gradient(returns)
            log_probs = jax.nn.log_softmax(logits).reshape((*trajectory.rewards.shape, -1))
            taken = jnp.take_along_axis(log_probs, trajectory.actions[..., None], -1)[..., 0]
            advantage = jax.lax.stop_gradient(returns - values)
            mask = trajectory.valid.astype(jnp.float32)
            policy = -jnp.sum(taken * advantage * mask) / jnp.sum(mask)
            baseline = jnp.sum((returns - values) ** 2 * mask) / jnp.sum(mask)
            return policy + 0.5 * baseline, {"baseline_loss": baseline}

        (_, metrics), grads = chips.value_and_grad(loss, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), metrics

    return Agent(init=init, policy=lambda state: state[0], act=act, greedy=greedy,
                 update=update)


REINFORCE = Algorithm("reinforce", ReinforceConfig, build_reinforce, (DISCRETE,),
                      "REINFORCE with a baseline (defined in a test)")


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "env"), [("actors", "CartPole-v1"),
                                           ("anakin", "workbench/CartPole-v1")])
def test_an_algorithm_registered_in_a_cell_trains_cartpole_in_both_modes(two_by_two, mode,
                                                                         env):
    wb.algos.register(REINFORCE, replace=True)
    config = TrainConfig(env=env, mode=mode, algo="reinforce", total_env_steps=250_000,
                         seed=0, eval_every=0, sync="gradients")
    result = train(two_by_two, config)
    assert result.algo == "reinforce" and result.mode == mode
    assert all("baseline_loss" in row for row in result.curve)
    first = next(r["mean_return_this_update"] for r in result.curve
                 if r["mean_return_this_update"] is not None)
    # A random CartPole policy lasts about 22 steps; this one must have learned.
    assert result.curve[-1]["mean_return_100"] > max(100.0, 3 * first), (first, result.curve[-1])
    assert len(set(result.chip_state_digests)) == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "config, match",
    [(TrainConfig(total_env_steps=0), "total_env_steps"),
     (TrainConfig(total_env_steps=-5), "total_env_steps"),
     (TrainConfig(envs_per_chip=2.5), "envs_per_chip"),
     (TrainConfig(env="NoSuchEnv-v0"), "Unknown environment"),
     (TrainConfig(resume=True), "checkpoint_dir"),
     (TrainConfig(algo="nope"), "Unknown algorithm 'nope'"),
     (TrainConfig(env="workbench/Catch-v0", target_return=float("nan")), "target_return"),
     (TrainConfig(env="Pendulum-v1", algo="pqn"), "continuous actions, and pqn handles discrete"),
     (TrainConfig(rollout_actors_per_host=3), "does not divide")],
)
def test_bad_training_configs_are_refused_before_anything_starts(two_by_two, config, match):
    before = set(live_actors())
    with pytest.raises(ValueError, match=match):
        train(two_by_two, config)
    # Nothing started, and the learners the slice keeps from earlier runs are untouched.
    assert set(live_actors()) == before


def test_resuming_from_a_path_that_is_not_a_checkpoint_says_so(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="does not exist"):
        checkpoint.restore(str(tmp_path / "nothing-here"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(checkpoint.CheckpointError, match="holds no workbench checkpoint"):
        checkpoint.restore(str(tmp_path / "empty"))


def test_rollout_actors_per_host_follow_the_hosts_cpus_when_left_to_the_workbench():
    from workbench.engine.plan import auto_rollout_actors

    # A vectorised env (CartPole) needs one actor per host whatever the CPUs.
    assert auto_rollout_actors(4, 8, vectorised=True) == 1
    # One stepped env by env: an actor per chip whose bundle has a CPU beside its learner.
    assert auto_rollout_actors(4, 2, vectorised=False) == 4
    assert auto_rollout_actors(8, 4, vectorised=False) == 8
    assert auto_rollout_actors(4, 1, vectorised=False) == 1
    # On a simulated slice, no more than this machine's spare cores, and a divisor of the
    # host's chips (each actor feeds an equal share).
    assert auto_rollout_actors(4, 2, vectorised=False, machine_cpus=3) == 2
    assert auto_rollout_actors(4, 2, vectorised=False, machine_cpus=0) == 1
    # 0 is the default and valid; negative counts are not.
    assert TrainConfig().rollout_actors_per_host == 0
    with pytest.raises(ValueError, match="rollout_actors_per_host"):
        TrainConfig(rollout_actors_per_host=-1).validate()
