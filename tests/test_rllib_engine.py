"""The RLlib engine: RLlib's own PPO on a simulated v6e 2x2, its learners one per chip in
the slice's bundles and its env runners on the same bundles' CPUs, checkpointed with
RLlib's own ``save_to_path`` (also when the CLI gets SIGTERM) and resumed from it; configs
that cannot fit are refused before anything starts. RLlib runs at a few hundred env steps
a second on this machine, so the runs here are short (PPO's learning is checked as a
return well above a random policy's); its time to CartPole's target against plain RLlib
is the benchmarks' to measure.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
from support.cluster_state import live_actor_names, live_actor_records, live_placement_groups
from support.processes import start_until_progress

import workbench as wb
from workbench.engine.rllib.backend import learner_backend
from workbench.engine.rllib.placement import SlicePlacement

WORKBENCH = str(Path(sys.executable).with_name("workbench"))


def _ppo(num_env_runners: int = 2):
    from ray.rllib.algorithms.ppo import PPOConfig

    # RLlib's CartPole example settings, with its default network (learns faster in the
    # few iterations a test affords than the example's small linear one).
    return (PPOConfig().environment("CartPole-v1")
            .env_runners(num_env_runners=num_env_runners)
            .training(lr=0.0003, num_epochs=6, vf_loss_coeff=0.01)
            .debugging(seed=0))


def _slice_resources_free(tpu_slice) -> dict[str, float]:
    """The slice's own TPU and CPU still free (Ray names a placement group's resources
    ``<resource>_group_<id>``)."""
    suffix = f"_group_{tpu_slice.placement_group.id.hex()}"
    free = ray.available_resources()
    return {name: free.get(f"{name}{suffix}", 0.0) for name in ("TPU", "CPU")}


def _all_given_back(tpu_slice, actors_before: set[str], timeout_s: float = 15.0) -> bool:
    """Whether RLlib's actors are gone and the slice's TPU and CPU all free again (a
    stopped actor leaves, and its resources come back, a moment after ``stop()``)."""
    deadline = time.monotonic() + timeout_s
    while (_slice_resources_free(tpu_slice) != {"TPU": 4.0, "CPU": 8.0}
           or set(live_actor_names()) - actors_before):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.mark.slow
def test_sigterm_to_the_cli_keeps_a_checkpoint_the_next_command_resumes_from(sim_cluster,
                                                                           tmp_path):
    """``workbench train --engine rllib`` as a pod runs it: SIGTERM mid-run (GKE evicting
    the pod), then the same command again. Both join the running session cluster. The
    command samples in its own process (no env runner actors: each costs about 15 s of
    imports here; the killed-env-runner test below has them)."""
    groups_before = live_placement_groups()
    actors_before = set(live_actor_names())
    run_dir = tmp_path / "evicted"
    command = [WORKBENCH, "train", "--engine", "rllib", "--algo", "PPO", "--env",
               "CartPole-v1", "--set", "lr=0.0003", "--set", "num_epochs=6",
               "--set", "num_env_runners=0", "--learners", "1", "--checkpoint-every", "2",
               "--run-dir", str(run_dir), "--address", sim_cluster.address]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    process, lines = start_until_progress([*command, "--total-env-steps", "400000"], env)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    code = process.wait(30)
    stderr = "".join(lines)
    assert code == 128 + signal.SIGTERM, stderr
    assert time.monotonic() - sent < 30, "past a pod's grace period"
    assert "Traceback" not in stderr
    assert f"--engine rllib --run-dir {run_dir}" in stderr, stderr
    # The stop wrote a checkpoint of the iteration it ended with.
    iterations = sorted(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").iterdir())
    assert iterations and iterations[0] >= 1, iterations
    stopped_at = iterations[-1]
    deadline = time.monotonic() + 30
    while live_placement_groups() != groups_before or set(live_actor_names()) - actors_before:
        assert time.monotonic() < deadline, "the stopped command left its slice or actors"
        time.sleep(0.5)

    resumed = subprocess.run([*command, "--total-env-steps", str((stopped_at + 4) * 4000),
                              "--json", str(tmp_path / "resumed.json")],
                             capture_output=True, text=True, timeout=300, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    record = json.loads((tmp_path / "resumed.json").read_text())
    assert (record["engine"], record["algo"], record["chips"]) == ("rllib", "PPO", 4)
    assert record["resumed_from_update"] == stopped_at
    assert record["updates"] == stopped_at + 4
    assert record["curve"][0]["env_steps"] == (stopped_at + 1) * 4000
    assert len(record["chip_state_digests"]) == 1  # the one learner asked for
    # It learned (a random CartPole policy returns about 20).
    assert record["curve"][-1]["mean_return_100"] > 50, record["curve"]
    assert f"iteration-{stopped_at + 4}" in record["checkpoint"]
    every_second = [i for i in range(2, stopped_at + 4, 2) if i > stopped_at]
    assert {f"iteration-{i}" for i in every_second} <= {
        p.name for p in (run_dir / "checkpoints").iterdir()}
    assert set(live_actor_names()) <= actors_before


@pytest.mark.slow
def test_dqn_sac_and_appo_train_through_the_slices_placement(two_by_two):
    """One iteration each (RLlib's defaults): RLlib's value-based, continuous-action and
    asynchronous algorithms through the same placement. APPO takes two chips and an env
    runner (notebook 07's test has PPO on all four); DQN and SAC one learner each, sampling
    in the driver: each RLlib process costs about 15 s of imports here, and where env
    runners go is the PPO and APPO runs' to show."""
    from workbench.engine.rllib.algorithms import rllib_config

    actors_before = set(live_actor_names())
    for algo, env, learners, runners in (("DQN", "CartPole-v1", 1, 0),
                                         ("SAC", "Pendulum-v1", 1, 0),
                                         ("APPO", "CartPole-v1", 2, 1)):
        config = rllib_config(algo, env, settings=(f"num_env_runners={runners}",)).learners(
            num_learners=learners)
        seen = []
        result = wb.train_rllib(two_by_two, config, wb.RLlibOptions(total_env_steps=1),
                                on_update=lambda row, seen=seen: seen.append(
                                    _slice_resources_free(two_by_two)))
        # Each learner took a chip and a CPU, each env runner a CPU: the run is inside the
        # reservation (8 CPUs, 2 per chip).
        assert seen[0] == {"TPU": 4.0 - learners, "CPU": 8.0 - learners - runners}, algo
        assert (result.engine, result.algo, result.env) == ("rllib", algo, env)
        assert result.env_steps > 0
        assert result.checkpoint.endswith(f"iteration-{result.updates}")
        assert len(result.chip_state_digests) == learners, algo
        assert len(set(result.chip_state_digests)) == 1, algo
        # RLlib's actors are gone; the slice (the user's) is still held.
        assert _all_given_back(two_by_two, actors_before), algo
        assert ray.util.placement_group_table(two_by_two.placement_group)["state"] == "CREATED"


@pytest.mark.slow
def test_a_killed_env_runner_comes_back_and_a_killed_learner_restarts_from_a_checkpoint(
        two_by_two, tmp_path):
    def live(class_name: str) -> dict[str, dict]:
        """Live actors whose class name ends with ``class_name``."""
        return {actor_id: a for actor_id, a in live_actor_records().items()
                if a["ActorClassName"].endswith(class_name)}

    actors_before = set(live_actor_names())
    killed: list[str] = []
    seen: list[dict] = []

    def on_update(row: dict) -> None:
        if row["update"] == 1:
            actor_id, victim = sorted(live("SingleAgentEnvRunner").items())[0]
            os.kill(victim["Pid"], signal.SIGKILL)  # the process dies as a lost pod's would
            killed.append(actor_id)
        elif row["update"] == 4 and not seen:
            seen.append(_slice_resources_free(two_by_two))
            # Then a learner: the checkpoint of update 4 can no longer be written.
            # Ray Train runs each learner in its wrapper class.
            (learner,) = live("._WrappedExecutable").values()
            os.kill(learner["Pid"], signal.SIGKILL)

    # One learner: the env runners are what the first kill is about. A checkpoint each
    # iteration, so the learner's loss costs one.
    result = wb.train_rllib(two_by_two, _ppo().learners(num_learners=1), wb.RLlibOptions(
        total_env_steps=20_000, checkpoint_every=1, run_dir=str(tmp_path / "run")),
        on_update=on_update)
    # Ray restarted the env runner (RLlib asks for restarts) in its bundle of the slice: the
    # slice's CPUs were as used as before the kill, and nothing ran outside the reservation.
    assert seen == [{"TPU": 3.0, "CPU": 5.0}]
    from ray._private.state import actors  # the whole table: that runner has ended since

    assert actors()[killed[0]]["NumRestarts"] >= 1
    # The lost learner restarted the algorithm from update 3's checkpoint on an intact 2x2.
    assert result.restarts == 1 and result.env_steps_redone == 4000, result.curve
    assert [row["update"] for row in result.curve] == [1, 2, 3, 4, 5]
    assert result.updates == 5 and result.env_steps >= 20_000
    assert result.checkpoint.endswith("iteration-5")
    assert _all_given_back(two_by_two, actors_before)


@pytest.mark.slow
@pytest.mark.parametrize("change, words", [
    (lambda c: c.env_runners(num_env_runners=5), "at most 4 env runners"),
    (lambda c: c.learners(num_learners=5), "the slice has 4 chips"),
    (lambda c: c.env_runners(num_env_runners=2, num_gpus_per_env_runner=1), "no GPUs"),
])
def test_configs_that_cannot_fit_the_slice_are_refused_before_anything_starts(
        two_by_two, change, words):
    actors_before = set(live_actor_names())
    with pytest.raises(ValueError, match=words):
        wb.train_rllib(two_by_two, change(_ppo()))
    assert set(live_actor_names()) <= actors_before
    assert _all_given_back(two_by_two, actors_before)


def test_each_platform_gets_its_device_collective_and_device_manager():
    chip, simulated = learner_backend("tpu"), learner_backend("cpu")
    assert (chip.device, chip.collective, chip.device_manager) == (
        "tpu", "tpu_dist", "TPUTorchDeviceManager")
    assert (simulated.device, simulated.collective, simulated.device_manager) == (
        "cpu", "gloo", "CPUTorchDeviceManager")
    with pytest.raises(ValueError, match="'gpu'"):
        learner_backend("gpu")


def test_env_runners_go_round_the_chips_and_evaluation_runners_after_them():
    placement = SlicePlacement(placement_group=None, chip_bundles=(3, 0, 1, 2),
                               num_env_runners=5, backend=learner_backend("cpu"))
    assert [placement.runner_bundle(i, False) for i in range(1, 6)] == [3, 0, 1, 2, 3]
    assert [placement.runner_bundle(i, True) for i in range(1, 3)] == [0, 1]


@pytest.mark.parametrize(("options", "message"), [
    ({"recover_timeout_s": 0}, "recover_timeout_s must be a positive number of seconds, got 0."),
    ({"recover_timeout_s": float("nan")}, "recover_timeout_s must be a finite number"),
    ({"max_restarts": -1}, "max_restarts must be a whole number >= 0, got -1."),
    ({"checkpoint_every": 0}, "checkpoint_every must be a positive whole number, got 0."),
    ({"target_return": "high"}, "target_return must be a finite number, got 'high'."),
])
def test_bad_rllib_options_say_what_is_wrong(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        wb.RLlibOptions(**options)


def test_without_torch_the_engine_names_its_extra():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from workbench.engine.rllib.run import require_torch\n"
            "try:\n    require_torch()\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "pip install 'tpu-rl-workbench[rllib]'" in out
