"""Training on simulated slices: learners pinned one per chip in one jax.distributed group."""

from __future__ import annotations

import hashlib

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import live_actors

import workbench as wb
from workbench import checkpoint
from workbench.algos.ppo import PPOConfig, ppo_loss
from workbench.engine import TrainConfig, train
from workbench.learner import tpu_process_environment

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


def test_a_run_records_what_users_read(first_run):
    result, _ = first_run
    record = result.to_json()
    for key in ("env_steps", "wall_s", "final_return", "env_steps_per_s",
                "time_to_eval_target_s", "time_to_train_target_s", "startup_s", "generation",
                "topology", "chips", "hosts", "mode", "algo", "env", "seed"):
        assert key in record
    assert (result.chips, result.hosts, result.updates) == (4, 1, 3)
    assert result.env_steps == 3 * 1024 and result.env_steps_per_s > 0
    assert [row["update"] for row in result.curve] == [1, 2, 3]
    assert all(len(row["chip_step_s"]) == 4 for row in result.curve)
    assert 8 <= result.final_return <= 500
    assert live_actors() == []


def test_every_chip_ends_with_the_same_parameters(first_run):
    result, _ = first_run
    assert len(result.chip_state_digests) == 4
    assert len(set(result.chip_state_digests)) == 1


def test_the_final_checkpoint_holds_the_final_state(first_run):
    result, directory = first_run
    saved = checkpoint.restore(directory)
    assert int(saved["update"]) == 3 and int(saved["env_steps"]) == 3 * 1024
    assert _digest(checkpoint.unpack(saved)) == result.chip_state_digests[0]


def test_same_seed_same_curve_and_resume_continues_exactly(first_run, cluster, tmp_path):
    result, directory = first_run
    with wb.reserve("v6e", "2x2", timeout_s=60, cpus_per_chip=2) as tpu_slice:
        again = train(tpu_slice, TrainConfig(seed=7, **SMALL))
        # Resuming a finished run loads its state and has nothing left to do: the chips
        # must then hold exactly what the checkpoint holds.
        resumed = train(tpu_slice, TrainConfig(seed=7, checkpoint_dir=directory, resume=True,
                                               **SMALL))
    curve = [(r["episodes"], r["mean_return_this_update"], r["loss"]) for r in result.curve]
    assert curve == [(r["episodes"], r["mean_return_this_update"], r["loss"])
                     for r in again.curve]
    assert again.chip_state_digests == result.chip_state_digests
    assert resumed.updates == 3
    assert set(resumed.chip_state_digests) == {result.chip_state_digests[0]}


def test_a_loss_defined_in_a_notebook_cell_trains_with_per_minibatch_all_reduce(cluster):
    def ppo_with_value_clip(params, apply_fn, batch, config):
        loss, metrics = ppo_loss(params, apply_fn, batch, config)
        extra = 0.01 * jnp.mean(jnp.square(apply_fn(params, batch.obs)[1]))
        return loss + extra, {**metrics, "value_penalty": extra}

    small = dict(SMALL, total_env_steps=2 * 1024, eval_every=0)
    with wb.reserve("v6e", "2x2", timeout_s=60, cpus_per_chip=2) as tpu_slice:
        result = train(tpu_slice, TrainConfig(seed=1, ppo=PPOConfig(), sync="gradients",
                                              **small), loss_fn=ppo_with_value_clip)
    assert result.algo == "ppo_with_value_clip"
    assert all("value_penalty" in row for row in result.curve)
    # The other way of keeping chips equal: an all-reduce of gradients per minibatch.
    assert len(set(result.chip_state_digests)) == 1


@pytest.mark.parametrize(
    "config, match",
    [(TrainConfig(total_env_steps=0), "total_env_steps"),
     (TrainConfig(total_env_steps=-5), "total_env_steps"),
     (TrainConfig(envs_per_chip=2.5), "envs_per_chip"),
     (TrainConfig(env="NoSuchEnv-v0"), "Unknown environment"),
     (TrainConfig(resume=True), "checkpoint_dir"),
     (TrainConfig(rollout_actors_per_host=3), "does not divide")],
)
def test_bad_training_configs_are_refused_before_anything_starts(cluster, config, match):
    with (
        wb.reserve("v6e", "2x2", timeout_s=60, cpus_per_chip=2) as tpu_slice,
        pytest.raises(ValueError, match=match),
    ):
        train(tpu_slice, config)
    assert live_actors() == []


def test_resuming_from_a_path_that_is_not_a_checkpoint_says_so(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="does not exist"):
        checkpoint.restore(str(tmp_path / "nothing-here"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(checkpoint.CheckpointError, match="holds no workbench checkpoint"):
        checkpoint.restore(str(tmp_path / "empty"))


def test_tpu_process_environment_for_one_process_per_chip():
    addresses = [f"10.0.0.{i // 4}:{8476 + i % 4}" for i in range(16)]
    env = tpu_process_environment("4x4", rank=5, process_addresses=addresses, port=8477)
    assert env == {
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": "4,4,1",
        "TPU_PROCESS_ADDRESSES": ",".join(addresses),
        "TPU_PROCESS_PORT": "8477",
        "CLOUD_TPU_TASK_ID": "5",
    }
    assert tpu_process_environment("2x2x2", 0, addresses[:8], 8476)["TPU_PROCESS_BOUNDS"] == \
        "2,2,2"
    with pytest.raises(ValueError, match="16 chips"):
        tpu_process_environment("4x4", 0, addresses[:4], 8476)
