"""Experiments on a simulated slice: a sweep of seeds and a grid in one program per chip,
tracked runs read back with TensorBoard's and MLflow's own readers, and a trained policy
evaluated, drawn and served over real HTTP with good and bad requests."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from support.cluster_state import live_actor_records, live_actors

import workbench as wb
from workbench.algos.ppo import PPOConfig
from workbench.engine import TrainConfig, train
from workbench.engine.in_process import train_in_process
from workbench.engine.sweep import sweep

WORKBENCH = str(Path(sys.executable).with_name("workbench"))
CATCH = dict(env="workbench/Catch-v0", mode="anakin", envs_per_chip=8, rollout_length=16,
             eval_every=0, eval_episodes=4)


@pytest.fixture(scope="module")
def trained_cartpole(two_by_two, tmp_path_factory):
    """A short actors-mode CartPole run, tracked with TensorBoard."""
    run_dir = tmp_path_factory.mktemp("cartpole") / "run"
    config = TrainConfig(env="CartPole-v1", total_env_steps=12 * 4 * 16 * 64, eval_every=4,
                         eval_episodes=5, seed=0, run_dir=str(run_dir), track="tensorboard")
    return train(two_by_two, config)


@pytest.mark.slow
def test_a_sweep_runs_every_trial_of_a_grid_in_one_program_per_chip(two_by_two, tmp_path):
    seen: list[tuple[int, int]] = []
    config = TrainConfig(**CATCH, total_env_steps=60 * 8 * 16, seed=0,
                         run_dir=str(tmp_path / "sweep"))
    result = sweep(two_by_two, config, seeds="0-5", grid={"ppo.learning_rate": [3e-3, 1e-4]},
                   on_update=lambda trial, row: seen.append((trial, row["update"])))
    assert result.programs == 1 and len(result.trials) == 12 and len(result.configs) == 2
    # Every trial ran every update, and each was reported as it happened.
    assert sorted(seen) == [(t, u) for t in range(12) for u in range(1, 61)]
    assert all(t["updates"] == 60 and t["final_return"] is not None for t in result.trials)
    assert [t["seed"] for t in result.trials] == [0, 1, 2, 3, 4, 5] * 2
    # Each trial keeps its own seed and learning rate: the same seed with another rate
    # learns differently, and no two seeds of one config share a curve.
    losses = {t["trial"]: [r["loss"] for r in t["curve"]] for t in result.trials}
    assert losses[0] != losses[6] and len({tuple(v) for v in losses.values()}) == 12
    fast, slow = result.configs
    assert fast["overrides"] == {"ppo.learning_rate": 3e-3}
    assert fast["final_return"]["count"] == 6 and fast["final_return"]["iqm_ci"] is not None
    assert fast["final_return"]["iqm"] > slow["final_return"]["iqm"], result.configs
    record = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert record["configs"][0]["label"] == "ppo.learning_rate=0.003"
    result.plot(str(tmp_path / "bands.png"))
    assert (tmp_path / "bands.png").stat().st_size > 5000


@pytest.mark.slow
def test_a_sweep_trial_is_the_run_its_seed_makes_on_one_chip(two_by_two, tmp_path):
    config = TrainConfig(**CATCH, total_env_steps=3 * 8 * 16, seed=4,
                         algo_config=PPOConfig(learning_rate=2e-3))
    alone = train_in_process(config)  # a one-chip run of the same seed and config
    swept = sweep(two_by_two, config.replace(run_dir=str(tmp_path / "sweep")), seeds=[1, 4],
                  grid={"learning_rate": [2e-3]})
    trial = next(t for t in swept.trials if t["seed"] == 4)
    for ours, theirs in zip(trial["curve"], alone.curve, strict=True):
        assert ours["episodes"] == theirs["episodes"]
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-4, abs=1e-5)


@pytest.mark.slow
def test_a_stopped_sweep_ends_after_its_current_update_and_each_trial_is_tracked(two_by_two,
                                                                                 tmp_path):
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    config = TrainConfig(**CATCH, total_env_steps=1000 * 8 * 16, run_dir=str(tmp_path / "s"),
                         track="mlflow", tracking_uri=uri)
    # Catch's updates take a few milliseconds here, and the chips are a few hundred updates
    # ahead of the driver's rows (seen: up to 180); the driver reads the board every 0.05 s
    # so that the stop asked for at update 3 lands well before update 1000.
    run = wb.engine.run.SweepRun(two_by_two, config, seeds=4, poll_s=0.05)
    run.on_update(lambda trial, row: run.stop() if row["update"] >= 3 else None)
    result = run.start().wait(timeout_s=300)
    assert result.stopped and all(t["updates"] < 1000 for t in result.trials), [
        t["updates"] for t in result.trials]
    # Every trial is an MLflow run of its own, with its seed and its every update.
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("workbench").experiment_id])
    by_name = {r.info.run_name: r for r in runs}
    assert sorted(by_name) == [f"trial-{i:04d}" for i in range(4)]
    for trial in result.trials:
        tracked = by_name[f"trial-{trial['trial']:04d}"]
        assert tracked.data.params["seed"] == str(trial["seed"])
        assert tracked.data.params["env"] == "workbench/Catch-v0"
        history = client.get_metric_history(tracked.info.run_id, "train/loss")
        assert [m.step for m in history] == [r["env_steps"] for r in trial["curve"]]
        assert history[-1].value == pytest.approx(trial["curve"][-1]["loss"], rel=1e-5)
        assert tracked.info.status == "FINISHED"


def _suspend_chip_1(stopped: list):
    """A sweep callback that, at the first row of update 2, suspends chip 1's process
    (SIGSTOP: alive, holding its chip, answering nothing) and notes its pid and when."""
    import time

    import psutil

    def hang_chip_1(trial: int, row: dict) -> None:
        if row["update"] >= 2 and not stopped:
            (pid,) = [a["Pid"] for a in live_actor_records().values()
                      if a.get("Name", "").endswith(":sweep-1")]
            psutil.Process(pid).suspend()
            stopped[:] = [pid, time.monotonic()]

    return hang_chip_1


@pytest.mark.slow
def test_a_chip_that_stops_answering_has_its_program_run_again(two_by_two, tmp_path):
    before = set(live_actors())
    config = TrainConfig(**CATCH, total_env_steps=40 * 8 * 16, progress_timeout_s=5,
                         run_dir=str(tmp_path / "s"))
    stopped: list = []
    first_rows: dict[int, list[dict]] = {}
    hang = _suspend_chip_1(stopped)

    def watch(trial: int, row: dict) -> None:
        hang(trial, row)
        first_rows.setdefault(trial, []).append(row)

    result = sweep(two_by_two, config, seeds=4, on_update=watch)
    assert stopped and result.restarts == 1
    assert all(t["updates"] == 40 and t["final_return"] is not None for t in result.trials)
    # The program ran again from its start with the same seeds: the rows a trial of
    # another chip sent in the first attempt are exactly its rows in the result.
    compared = 0
    for trial in result.trials:
        sent = first_rows[trial["trial"]][:40]
        if [r["update"] for r in sent] == list(range(1, 41)):
            compared += 1
            assert [(r["env_steps"], r["loss"]) for r in sent] == \
                [(r["env_steps"], r["loss"]) for r in trial["curve"]]
    assert compared >= 2  # the trials of the chips that kept answering
    assert set(live_actors()) <= before


@pytest.mark.slow
def test_a_chip_that_stops_answering_fails_the_sweep_instead_of_hanging_it(two_by_two,
                                                                         tmp_path):
    import time

    import psutil

    from workbench.engine.sweep import SweepFailed

    before = set(live_actors())
    config = TrainConfig(**CATCH, total_env_steps=400 * 8 * 16, progress_timeout_s=5,
                         max_restarts=0, run_dir=str(tmp_path / "s"))
    stopped: list = []

    # Whichever comes first ends it: the other chips' progress stops (progress_timeout_s),
    # or jax.distributed takes them down when the stopped chip misses its heartbeats.
    with pytest.raises(SweepFailed, match="chip"):
        sweep(two_by_two, config, seeds=4, on_update=_suspend_chip_1(stopped))
    assert time.monotonic() - stopped[1] < 60
    # Every chip's actor was stopped; the suspended one's process goes once Ray's kill
    # reaches it (a stopped process cannot exit by itself).
    assert set(live_actors()) <= before
    with contextlib.suppress(psutil.NoSuchProcess):
        _, alive = psutil.wait_procs([psutil.Process(stopped[0])], timeout=30)
        assert all(p.status() == psutil.STATUS_ZOMBIE for p in alive)


@pytest.mark.slow
def test_tensorboard_reads_a_tracked_run_without_tensorflow(trained_cartpole):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(Path(trained_cartpole.run_dir) / "tensorboard"),
                              size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"train/loss", "train/env_steps_per_s", "eval/mean_return",
            "result/final_return"} <= set(tags)
    losses = events.Scalars("train/loss")
    assert [e.step for e in losses] == [r["env_steps"] for r in trained_cartpole.curve]
    assert losses[-1].value == pytest.approx(trained_cartpole.curve[-1]["loss"], rel=1e-5)
    assert len(events.Scalars("eval/mean_return")) == 3  # updates 4, 8 and 12
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["env"].string_value == "CartPole-v1"
    assert hparams["algo_config.learning_rate"].number_value == pytest.approx(5e-4)


@pytest.mark.slow
def test_eval_plays_the_trained_policy_and_draws_it(trained_cartpole, tmp_path):
    gif, record = tmp_path / "episode.gif", tmp_path / "eval.json"
    done = subprocess.run([WORKBENCH, "eval", trained_cartpole.run_dir, "--episodes", "10",
                           "--gif", str(gif), "--json", str(record)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    evaluated = json.loads(record.read_text())
    assert evaluated["episodes"] == 10 and len(evaluated["returns"]) == 10
    assert evaluated["update"] == trained_cartpole.updates
    # The same greedy policy on the same start states as the run's own final evaluation.
    from PIL import Image

    with Image.open(gif) as image:
        assert image.n_frames > 5 and image.size == (600, 400)
    assert evaluated["mean_return"] > 20


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "/nonexistent/run"], "holds no checkpoint"),
        (["eval", "RUN", "--episodes", "0"], "--episodes: must be a positive whole number"),
        (["eval", "RUN", "--gif", "/nonexistent/dir/a.gif"], "--gif /nonexistent/dir/a.gif: "
                                                              "the folder"),
        (["serve", "/nonexistent/run"], "holds no checkpoint"),
        (["sweep", "--grid", "ppo.learning_rte=1e-3"], "learning_rte is not a field of ppo's "
                                                        "config. Did you mean learning_rate"),
        (["sweep", "--seeds", "0-x"], "seeds must be like 0-63"),
        (["train", "--track", "wandb"], "--track"),
    ],
)
def test_bad_experiment_commands_say_what_is_wrong_in_one_line(trained_cartpole, args,
                                                                message):
    args = [trained_cartpole.run_dir if a == "RUN" else a for a in args]
    done = subprocess.run([WORKBENCH, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr


def _post(url: str, body: bytes, content_type: str = "application/json"):
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _replica_nodes() -> set[str]:
    """The nodes the live Serve replicas run on."""
    from ray._private.state import actors

    return {a["Address"]["NodeID"] for a in actors().values()
            if "ServeReplica" in a["ActorClassName"] and a["State"] == "ALIVE"}


@pytest.mark.slow
def test_a_served_policy_answers_good_requests_and_refuses_bad_ones(trained_cartpole,
                                                                    two_by_two):
    from workbench.engine.serving import serve_policy

    before = set(live_actors())
    policy = wb.load(trained_cartpole.run_dir)
    act = policy.greedy_policy()
    observations = np.random.default_rng(0).normal(0, 0.1, size=(70, 4)).astype(np.float32)
    with serve_policy(trained_cartpole.run_dir, max_batch_size=16, replicas=2,
                      tpu_slice=two_by_two) as server:
        assert server.url.startswith("http://127.0.0.1:")
        # The replicas run on the slice's hosts.
        replica_nodes = _replica_nodes()
        assert len(replica_nodes) >= 1
        assert replica_nodes <= {host.node_id for host in two_by_two.hosts}
        status, answer = _post(server.url, json.dumps({"observation":
                                                       observations[0].tolist()}).encode())
        assert status == 200 and answer["action"] == int(act(observations[0]))
        status, answer = _post(server.url, json.dumps({"observations":
                                                       observations.tolist()}).encode())
        assert status == 200
        assert answer["actions"] == [int(act(o)) for o in observations]
        bad = [
            (b"not json", 400, "not JSON"),
            (json.dumps({"observation": [1, 2, 3]}).encode(), 400, "shape [4] was expected"),
            (json.dumps({"observation": ["a", "b", "c", "d"]}).encode(), 400,
             "not an array of numbers"),
            (json.dumps({"obs": [0, 0, 0, 0]}).encode(), 400, "expected a JSON object"),
            (json.dumps({"observation": [0, float("nan"), 0, 0]}).encode(), 400, "NaN"),
            (b"[" * (2 << 20), 413, "larger than"),
        ]
        for body, code, words in bad:
            status, answer = _post(server.url, body)
            assert status == code and words in answer["error"], (body[:40], status, answer)
        # The replica is still there and still right after every bad request.
        status, answer = _post(server.url, json.dumps({"observation":
                                                       observations[1].tolist()}).encode())
        assert status == 200 and answer["action"] == int(act(observations[1]))
    leftover = [a for a in set(live_actors()) - before]
    assert leftover == [], "serving left actors behind"


def _settled_free_chips() -> float:
    """The cluster's free TPU count once it stops changing (a slice released by an earlier
    test hands its chips back a moment later)."""
    import time

    import ray

    last = ray.available_resources().get("TPU", 0)
    for _ in range(20):
        time.sleep(0.5)
        now = ray.available_resources().get("TPU", 0)
        if now == last:
            return now
        last = now
    return last


@pytest.mark.slow
def test_replicas_on_chips_hold_one_chip_each_while_serving(trained_cartpole, two_by_two):
    import time

    import ray

    from workbench.engine.serving import serve_policy

    # Refused before Serve starts: chips inside a held slice, or more chips than are free.
    with pytest.raises(ValueError, match="keeps all of its chips in its placement group"):
        serve_policy(trained_cartpole.run_dir, on_chip=True, tpu_slice=two_by_two)
    free = _settled_free_chips()
    with pytest.raises(ValueError, match=f"need {int(free) + 1} free chip"):
        serve_policy(trained_cartpole.run_dir, on_chip=True, replicas=int(free) + 1)

    act = wb.load(trained_cartpole.run_dir).greedy_policy()
    observation = np.array([0.01, -0.02, 0.03, 0.0], np.float32)
    tpu_hosts = {n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("TPU")}
    with serve_policy(trained_cartpole.run_dir, on_chip=True, replicas=2) as server:
        assert ray.available_resources().get("TPU", 0) == free - 2  # one chip each
        replica_nodes = _replica_nodes()
        assert replica_nodes and replica_nodes <= tpu_hosts
        status, answer = _post(server.url, json.dumps({"observation":
                                                       observation.tolist()}).encode())
        assert status == 200 and answer["action"] == int(act(observation))
    deadline = time.monotonic() + 30
    while ray.available_resources().get("TPU", 0) < free:  # the chips come back
        assert time.monotonic() < deadline, "the replicas kept their chips after shutdown"
        time.sleep(0.5)


@pytest.mark.slow
def test_workbench_serve_answers_over_http_and_stops_cleanly_on_sigterm(trained_cartpole):
    """The command a user runs: its own local Ray, loopback HTTP, and SIGTERM (what a pod
    gets) ends it with the application and every process it started gone."""
    import os
    import signal
    import socket
    import threading
    import time

    import psutil

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([WORKBENCH, "serve", trained_cartpole.run_dir, "--port",
                                str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stderr.readline, "")),
                              daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while not any(line.startswith("Serving") for line in lines):
            assert process.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.5)
        serving = next(line for line in lines if line.startswith("Serving"))
        assert f"http://127.0.0.1:{port}" in serving
        act = wb.load(trained_cartpole.run_dir).greedy_policy()
        observation = [0.01, -0.02, 0.03, 0.0]
        status, answer = _post(f"http://127.0.0.1:{port}/",
                               json.dumps({"observation": observation}).encode())
        assert status == 200 and answer["action"] == int(act(np.float32(observation)))
        started = psutil.Process(process.pid).children(recursive=True)
        assert started, "the command started no Ray processes"
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        assert time.monotonic() - sent < 30
        reader.join(10)
        assert "the policy server stopped" in "".join(lines)
        assert "Traceback" not in "".join(lines)
    finally:
        if process.poll() is None:
            process.kill()
    gone, alive = psutil.wait_procs(started, timeout=15)
    assert alive == [], [p.pid for p in alive]


def test_the_sweep_dashboard_draws_a_program_run_again_from_its_start():
    from workbench.ui.sweep_dashboard import SweepDashboard

    board = SweepDashboard(4, [{"config": 0, "label": "default"}],
                           [{"trial": 0, "config": 0, "seed": 0}], redraw_s=1e9)

    def row(update: int) -> dict:
        return {"update": update, "env_steps": 128 * update, "mean_return_100": 0.1 * update}

    for update in (1, 2, 3):
        board.update(0, row(update))
    board.update(0, row(1))  # the program failed and runs again
    assert [r["update"] for r in board.trials[0]["curve"]] == [1]
    assert board.progress.value == pytest.approx(1 / 4)
