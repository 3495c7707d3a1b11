"""Checkpoints a user can trust, on the session's simulated cluster: each records its run
and a digest; a resume continues exactly, refuses another run's checkpoints or network,
falls back past a damaged step, moves to another slice shape; a policy loads outside the
run; SIGTERM to the CLI or to a notebook kernel stops with a checkpoint."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from support.cluster_state import live_actors, live_placement_groups
from support.processes import start_until_progress

import workbench as wb
from workbench.algos.ppo import PPOConfig
from workbench.engine import TrainConfig, checkpoint, train
from workbench.engine.plan import plan_run

# Every test here trains on the session cluster: the slow tier.
pytestmark = pytest.mark.slow

WORKBENCH = str(Path(sys.executable).with_name("workbench"))
# 4 chips x 8 envs x 32 steps = 1024 env steps per update.
SMALL = dict(envs_per_chip=8, rollout_length=32, eval_every=0, eval_episodes=4,
             checkpoint_every_s=0)
COMPARED = ("update", "env_steps", "episodes", "episodes_this_update", "mean_return_this_update",
            "mean_return_100", "loss", "entropy")


def _stop_after(update: int):
    """A should_stop that asks for a stop once ``update`` has been seen."""
    seen: list[int] = []

    def on_update(row: dict) -> None:
        seen.append(row["update"])

    return on_update, lambda: bool(seen) and seen[-1] >= update


def _rows(result, after: int) -> list[tuple]:
    return [tuple(row.get(k) for k in COMPARED) for row in result.curve if row["update"] > after]


@pytest.mark.parametrize(("mode", "env"), [("anakin", "workbench/CartPole-v1"),
                                           ("actors", "CartPole-v1")])
def test_a_run_stopped_and_resumed_ends_exactly_as_one_never_stopped(two_by_two, tmp_path,
                                                                     mode, env):
    # A stop lands within a poll of the metrics board, not within an update: the driver
    # polls often here, and the updates (about 30 ms each in Anakin mode, more in actors
    # mode on kept learners) are many, so that the stop asked for after update 4 lands
    # before the last update. The stopped run finds the board the whole run kept: a new
    # one's process start alone (about 2 s here) outlasted the run's 64 updates.
    updates = 64
    config = TrainConfig(env=env, mode=mode, seed=5, total_env_steps=updates * 1024, **SMALL)
    whole = train(two_by_two, config.replace(run_dir=str(tmp_path / "whole")))
    on_update, should_stop = _stop_after(4)
    stopped = train(two_by_two, config.replace(run_dir=str(tmp_path / "stopped")),
                    on_update=on_update, should_stop=should_stop, poll_s=0.05)
    k = stopped.updates
    assert 4 <= k < updates, k
    resumed = train(two_by_two, config.replace(run_dir=str(tmp_path / "stopped"), resume=True))
    assert resumed.resumed_from_update == k and resumed.exact_resume is True
    assert resumed.updates == updates
    assert _rows(resumed, k) == _rows(whole, k)
    assert resumed.chip_state_digests == whole.chip_state_digests


def test_a_checkpoint_records_its_run_and_the_folder_is_private(two_by_two):
    result = train(two_by_two, TrainConfig(seed=2, total_env_steps=2 * 1024, **SMALL))
    run_dir = Path(result.run_dir)
    assert run_dir.is_relative_to(Path(os.environ["WORKBENCH_RUNS"]))
    record = json.loads((run_dir / "run.json").read_text())
    assert (record["env"], record["algo"], record["seed"]) == ("CartPole-v1", "ppo", 2)
    assert json.loads((run_dir / "result.json").read_text())["updates"] == 2
    meta = checkpoint.latest_meta(str(run_dir / "checkpoints"))
    assert meta["slice"] == {"generation": "v6e", "topology": "2x2", "chips": 4}
    assert meta["algo_config"]["hidden_sizes"] == [64, 64] and len(meta["digest"]) == 64
    assert meta["workbench"] == wb.__version__ and meta["update"] == 2
    for folder in (run_dir, run_dir / "checkpoints"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


@pytest.fixture(scope="module")
def finished_run(two_by_two, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("finished")
    result = train(two_by_two, TrainConfig(seed=3, total_env_steps=3 * 1024,
                                           checkpoint_every=1, run_dir=str(run_dir),
                                           **SMALL))
    return result, run_dir


def test_resuming_with_another_network_or_env_is_refused_naming_both(finished_run):
    _, run_dir = finished_run
    base = TrainConfig(seed=3, total_env_steps=3 * 1024, run_dir=str(run_dir), resume=True,
                       **SMALL)
    with pytest.raises(checkpoint.CheckpointError) as error:
        plan_run(base.replace(algo_config=PPOConfig(hidden_sizes=(32,))))
    message = str(error.value)
    assert "algo_config" in message and "[64, 64]" in message and "[32]" in message
    with pytest.raises(checkpoint.CheckpointError, match="written with env \"CartPole-v1\""):
        plan_run(base.replace(env="Acrobot-v1"))
    # A new run must not write over another run's checkpoints.
    with pytest.raises(checkpoint.CheckpointError, match="Pass resume=True"):
        plan_run(base.replace(resume=False))


def test_a_damaged_latest_step_falls_back_to_the_one_before(finished_run, tmp_path, caplog):
    import shutil

    result, run_dir = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(run_dir / "checkpoints", copy)
    newest = max(int(p.name) for p in copy.iterdir() if p.name.isdigit())
    meta_path = copy / str(newest) / checkpoint.META
    meta = json.loads(meta_path.read_text())
    meta["digest"] = "0" * 64  # what a torn or tampered write looks like
    meta_path.write_text(json.dumps(meta))
    restored = checkpoint.restore(str(copy))
    assert restored.step == newest - 1
    assert "unusable" in caplog.text and "digest does not match" in caplog.text
    # A step left without its record (its host lost mid-save) is passed over too, and the
    # resumed run writes that step again when it gets there.
    (copy / str(newest) / checkpoint.META).unlink()
    assert checkpoint.restore(str(copy)).step == newest - 1
    checkpoint.save(str(copy), newest, restored.state, restored.meta,
                    resume=restored.resume, rollouts=restored.rollouts)
    rewritten = checkpoint.restore(str(copy))
    assert rewritten.step == newest and rewritten.meta["step"] == newest


def test_a_trained_policy_loads_outside_its_run(finished_run):
    result, run_dir = finished_run
    loaded = wb.load(run_dir)
    assert loaded.env == "CartPole-v1" and loaded.update == 3
    act, reference = loaded.greedy_policy(), result.greedy_policy()
    for obs in np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32):
        assert int(act(obs)) == int(reference(obs))
    with pytest.raises(checkpoint.CheckpointError, match="does not exist"):
        wb.load(run_dir / "nothing-here")


def test_a_checkpoint_continues_on_another_slice_shape(finished_run, sim_cluster, tmp_path):
    result, run_dir = finished_run
    import shutil

    shutil.copytree(run_dir, tmp_path / "moved")
    config = TrainConfig(seed=3, total_env_steps=3 * 1024, run_dir=str(tmp_path / "moved"),
                         resume=True, **SMALL)
    with wb.reserve("v6e", "2x4", timeout_s=60, cpus_per_chip=2) as eight:
        moved = train(eight, config)
    # The same state on eight chips (nothing left to learn at this budget), fresh envs.
    assert moved.chips == 8 and moved.exact_resume is False
    assert set(moved.chip_state_digests) == {result.chip_state_digests[0]}


def test_sigterm_to_the_cli_stops_with_a_checkpoint_the_run_resumes_from(tmp_path,
                                                                         sim_cluster):
    """What GKE does to a pod it evicts: SIGTERM, then SIGKILL 30 s later."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["TMPDIR"] = str(tmp_path)
    run_dir = tmp_path / "evicted"
    command = [WORKBENCH, "train", "--mode", "anakin", "--env", "workbench/CartPole-v1",
               "--total-env-steps", "50000000", "--eval-every", "0", "--run-dir", str(run_dir)]
    process, lines = start_until_progress(command, env)
    # Everything the command started (the simulated cluster, its nodes and workers), to
    # check that none of it outlives the command.
    started = psutil.Process(process.pid).children(recursive=True)
    assert len(started) > 5, started
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    code = process.wait(30)
    ended_s = time.monotonic() - sent
    stderr = "".join(lines)
    assert code == 128 + signal.SIGTERM, stderr
    assert ended_s < 30, f"took {ended_s:.1f} s, past a pod's grace period"
    assert "terminated by SIGTERM" in stderr and "--resume --checkpoint-dir" in stderr
    assert "Traceback" not in stderr
    step = checkpoint.latest_step(str(run_dir / "checkpoints"))
    assert step is not None and step >= 1
    _gone, alive = psutil.wait_procs(started, timeout=15)
    assert alive == [], [p.pid for p in alive]
    # The run goes on from there, here on a cluster that is already running (joined by its
    # address, as from a terminal beside a notebook).
    resumed = subprocess.run([*command[:-4], "--total-env-steps", str((step + 2) * 4096),
                              "--eval-every", "0", "--run-dir", str(run_dir), "--resume",
                              "--address", sim_cluster.address,
                              "--json", str(tmp_path / "resumed.json")],
                             capture_output=True, text=True, timeout=300, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    record = json.loads((tmp_path / "resumed.json").read_text())
    assert record["resumed_from_update"] == step and record["updates"] == step + 2


KERNEL_TRAINS = """
import workbench as wb
from workbench import ui
from workbench.engine import TrainConfig

wb.connect({address!r}, node_ip={node_ip!r})
tpu_slice = wb.reserve("v6e", "2x2", timeout_s=60, cpus_per_chip=2)
config = TrainConfig(env="workbench/CartPole-v1", mode="anakin", total_env_steps=50_000_000,
                     eval_every=0, seed=4, run_dir={run_dir!r})
run = ui.start_training(tpu_slice, config, show=False)
"""


def test_sigterm_to_a_kernel_that_trains_checkpoints_and_releases(sim_cluster, tmp_path):
    from jupyter_client.manager import start_new_kernel

    # The module's own slice (two_by_two) may be held: only what the kernel made counts.
    before, groups_before = set(live_actors()), set(live_placement_groups())
    run_dir = tmp_path / "kernel-run"
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        code = KERNEL_TRAINS.format(address=sim_cluster.address, node_ip=sim_cluster.node_ip,
                                    run_dir=str(run_dir))
        reply = client.execute_interactive(code, timeout=180)
        assert reply["content"]["status"] == "ok", reply["content"]
        counts: list[str] = []
        deadline = time.monotonic() + 240
        while not counts or int(counts[-1]) < 3:
            assert time.monotonic() < deadline, "the run in the kernel did not get going"
            time.sleep(1)
            client.execute_interactive(
                "print(len(run.rows))", timeout=30,
                output_hook=lambda msg: counts.extend(msg["content"].get("text", "").split()))
        pid = manager.provisioner.process.pid
        sent = time.monotonic()
        os.kill(pid, signal.SIGTERM)  # what the pod's processes get on eviction
        manager.provisioner.process.wait(30)
        ended_s = time.monotonic() - sent
    finally:
        client.stop_channels()
        if manager.is_alive():
            manager.shutdown_kernel(now=True)
    assert ended_s < 30, f"the kernel took {ended_s:.1f} s to go"
    step = checkpoint.latest_step(str(run_dir / "checkpoints"))
    assert step is not None and step >= 3, "no checkpoint of the run in the kernel"
    # The kernel released its slice; the cluster takes a moment to show it.
    deadline = time.monotonic() + 20
    while (set(live_placement_groups()) - groups_before or set(live_actors()) - before) and \
            time.monotonic() < deadline:
        time.sleep(0.5)
    assert set(live_placement_groups()) <= groups_before
    assert set(live_actors()) <= before
