"""Every notebook runs top to bottom through papermill against the session's simulated
cluster, and every bar it records holds; bad parameters fail with the catalog's message.

Executed notebooks are kept in ``build/notebooks/`` for reading after a failure.
"""

from __future__ import annotations

import _thread
import threading
import time
from pathlib import Path

import papermill as pm
import pytest
from support.cluster_state import live_actors, live_placement_groups

import workbench as wb
from workbench import ui
from workbench.engine import TrainConfig, checkpoint
from workbench.tpu.catalog import CatalogError

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
OUT = ROOT / "build" / "notebooks"

# Small parameters for CI; the notebooks' own defaults are sized for a person watching.
# A notebook missing here runs with its own defaults.
# Every notebook also gets the session cluster's address, so none starts a cluster, and
# the address the kernel is known by there (the simulated cluster lives on loopback).
CI_PARAMETERS: dict[str, dict] = {
    "01_quickstart.ipynb": dict(total_env_steps=100_000, seed=0, min_final_return=400.0),
    "02_slice_anatomy.ipynb": dict(contention_timeout_s=3.0),
    "03_ppo_rollout_actors.ipynb": dict(
        total_env_steps=40_960, seed=1, envs_per_chip=16, rollout_length=64, sync="gradients",
        min_env_steps_per_s=500.0, min_final_return=200.0,
    ),
    "04_anakin_jax_envs.ipynb": dict(
        total_env_steps=200_000, seed=0, min_final_return=150.0, min_env_steps_per_s=1000.0,
    ),
    # One shape only: each run's start-up (a learner process per chip) dominates CI time.
    "05_scaling_study.ipynb": dict(
        topologies_to_run=["2x2"], updates=3, envs_per_chip=8, rollout_length=32,
        min_env_steps_per_s=1000.0,
    ),
    "06_kuberay_gke.ipynb": dict(total_env_steps=20_480, seed=0, min_final_return=100.0),
    # Five RLlib iterations (4000 env steps each); a random CartPole policy returns ~20.
    "07_rllib_on_a_slice.ipynb": dict(total_env_steps=20_000, num_env_runners=1, seed=0,
                                      min_final_return=40.0),
    "09_algorithms.ipynb": dict(algo="impala", env_id="CartPole-v1", mode="actors",
                                policy_lag=2, total_env_steps=10 * 4 * 16 * 64, seed=0,
                                min_final_return=60.0),
    # Catch learns in a few dozen small updates, so four seeds of two rates stay cheap.
    "08_sweep.ipynb": dict(env_id="workbench/Catch-v0", seeds="0-3", learning_rates=[3e-3, 1e-4],
                           total_env_steps=60 * 8 * 64, envs_per_chip=8, min_best_iqm=0.5),
}


def _notebooks() -> list[str]:
    return sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))


def _execute(name: str, output: Path, parameters: dict) -> dict:
    output.parent.mkdir(parents=True, exist_ok=True)
    return pm.execute_notebook(
        str(NOTEBOOKS / name),
        str(output),
        parameters=parameters,
        kernel_name="python3",
        cwd=str(output.parent),
        progress_bar=False,
        execution_timeout=600,
    )


def _check_bars(name: str, recorded: dict) -> None:
    """Each recorded ``min_<metric>`` bar holds for ``<metric>`` (for every element of a list)."""
    bars = {key[len("min_"):]: bar for key, bar in recorded.items() if key.startswith("min_")}
    for metric, bar in bars.items():
        assert metric in recorded, f"{name} records the bar min_{metric} but not {metric}"
        values = recorded[metric] if isinstance(recorded[metric], list) else [recorded[metric]]
        assert values and all(v is not None and v >= bar for v in values), (
            f"{name}: {metric}={recorded[metric]} misses its bar of {bar}"
        )


def test_every_notebook_has_a_parameters_cell_and_no_outputs():
    import nbformat

    names = _notebooks()
    assert names, "no notebooks found"
    # A notebook renamed must not take its CI parameters, and the checks of its records
    # in test_notebook_runs_and_meets_its_bars, away without notice.
    assert set(CI_PARAMETERS) | RUN_ELSEWHERE <= set(names), sorted(names)
    for name in names:
        notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
        tagged = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1, f"{name} needs exactly one cell tagged 'parameters'"
        for needed in ("address", "node_ip"):
            assert needed in tagged[0].source, f"{name}'s parameters need {needed}"
        outputs = [c for c in notebook.cells if c.cell_type == "code" and c.get("outputs")]
        assert not outputs, f"{name} is committed with outputs; clear them"


# The quickstart runs in tests/test_binder.py instead, as on Binder: in an environment built
# from binder/ alone, with the same parameters, starting its own simulated cluster.
RUN_ELSEWHERE = {"01_quickstart.ipynb"}


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in _notebooks() if n not in RUN_ELSEWHERE])
def test_notebook_runs_and_meets_its_bars(name, cluster):
    parameters = {"address": cluster.address, "node_ip": cluster.node_ip,
                  **CI_PARAMETERS.get(name, {})}
    executed = _execute(name, OUT / name, parameters)
    recorded = ui.read_records(executed)
    assert recorded, f"{name} recorded no metrics"
    # Every bar the test asked for was recorded as asked, so it was checked in the run.
    for key, value in parameters.items():
        if key.startswith("min_"):
            assert recorded.get(key) == value, f"{name} did not record its bar {key}"
    _check_bars(name, recorded)
    if name == "02_slice_anatomy.ipynb":
        # The session cluster has two v6e 2x2 slices: the notebook holds both, a third
        # reservation is refused, saying both are in use, and both are free after release.
        assert recorded["slices_held"] == 2 and recorded["extra_refused"] is True
        refusal = recorded["refusal"]
        assert refusal.startswith("Could not reserve a v6e 2x2 slice (pod type v6e-4, 1 host(s)"
                                  " x 4 chips) within 3 s: "), refusal
        assert refusal.count("(v6e 2x2, v6e-4, 1/1 hosts, in use)") == 2, refusal
        assert "What to do: release a slice you hold" in refusal, refusal
        assert recorded["free_after_release"] == 2
        assert (recorded["chips"], recorded["hosts"]) == (4, 1)
    if name == "07_rllib_on_a_slice.ipynb":
        assert (recorded["engine"], recorded["algo"], recorded["learners"]) == ("rllib", "PPO", 4)
        assert recorded["chips_identical"] is True
    if name == "09_algorithms.ipynb":
        assert recorded["algo"] == "impala" and recorded["max_policy_lag"] == 2
        assert recorded["chips_identical"] is True


def _expected_message(**bad) -> tuple[str, str]:
    # The readable message the API itself gives for the same bad input.
    generation, topology = bad.get("generation", "v6e"), bad.get("topology", "2x2")
    if "total_env_steps" in bad:
        with pytest.raises(ValueError) as error:
            TrainConfig(total_env_steps=bad["total_env_steps"]).validate()
        return type(error.value).__name__, str(error.value)
    with pytest.raises(CatalogError) as error:
        wb.parse_shape(generation, topology)
    return "CatalogError", str(error.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    "bad",
    [{"generation": "v9"}, {"topology": "9x9"}, {"total_env_steps": 0}],
    ids=["generation-v9", "topology-9x9", "no-steps"],
)
def test_bad_parameters_fail_with_a_readable_message(bad, cluster):
    ename, message = _expected_message(**bad)
    label = "-".join(f"{k}-{v}" for k, v in bad.items())
    with pytest.raises(pm.PapermillExecutionError) as failure:
        _execute("01_quickstart.ipynb", OUT / f"bad-{label}.ipynb",
                 {"address": cluster.address, "node_ip": cluster.node_ip, **bad})
    assert failure.value.ename == ename
    assert message in failure.value.evalue
    # The `cluster` fixture then checks that no placement group was left behind.


@pytest.mark.slow
def test_stop_button_and_interrupt_end_training_cleanly(cluster, tmp_path, python_ctrl_c):
    config = TrainConfig(total_env_steps=5_000_000, envs_per_chip=8, rollout_length=32,
                         eval_every=0, eval_episodes=4, seed=3, checkpoint_dir=str(tmp_path))
    seen: dict = {}

    def click_then_interrupt(run: ui.DashboardRun) -> None:
        while not run.rows and not run.done:
            time.sleep(0.05)
        run.dashboard.stop_button.click()  # what a click in the browser does
        seen["stopped_by_click"] = run.stopped
        time.sleep(0.2)
        seen["interrupted_at"] = time.monotonic()
        if not run.done:  # never interrupt the test runner outside wait()
            _thread.interrupt_main()  # what the kernel's interrupt does to the waiting cell

    # NOTE: interrupt_main does nothing unless Python's own Ctrl-C handler is installed
    # (the python_ctrl_c fixture makes sure of it).
    with wb.reserve("v6e", "2x2", timeout_s=60, cpus_per_chip=2) as tpu_slice:
        run = ui.start_training(tpu_slice, config, show=False)
        threading.Thread(target=click_then_interrupt, args=(run,), daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            run.wait()
        ended_s = time.monotonic() - seen["interrupted_at"]
    assert seen["stopped_by_click"] is True
    assert run.done and run.error is None
    # A few seconds on an idle machine; the bound leaves room for a busy 2-core one.
    assert ended_s < 15, f"training took {ended_s:.1f} s to stop after the interrupt"
    planned = config.num_updates(4)
    assert 1 <= run.result.updates < planned
    saved = checkpoint.restore(str(tmp_path))
    assert saved.update == run.result.updates  # the final checkpoint of a stopped run
    assert run.dashboard.stop_button.disabled
    assert "Stopped" in run.dashboard.status.value
    assert live_actors() == []


def _wait_until(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the widget did not get there in time"
        time.sleep(0.1)


@pytest.mark.slow
def test_picker_reserves_shows_contention_and_releases(cluster):
    first = ui.SlicePicker("v6e", "2x4", timeout_s=60)
    second = ui.SlicePicker("v6e", "2x4", timeout_s=2)
    assert first.refresh() == 1 and "1 of 1 v6e 2x4" in first.capacity.value

    first.reserve_button.click()  # a click reserves in a thread; the kernel stays free
    _wait_until(lambda: first.slice is not None)
    assert first.slice.num_chips == 8 and "Reserved v6e 2x4" in first.status.value
    assert "learners are starting" in first.status.value  # the simulator keeps them warm
    assert first.reserve_button.disabled and first.generation_dropdown.disabled

    with pytest.raises(wb.SliceUnavailableError):
        second.reserve()
    assert "Could not reserve a v6e 2x4 slice" in second.status.value
    assert "Traceback" not in second.status.value and second.slice is None

    first.release_button.click()
    assert first.slice is None and "Released" in first.status.value
    _wait_until(lambda: second.refresh() == 1)
    # A picker given a run that cannot work on the slice says so, and holds nothing.
    third = ui.SlicePicker("v6e", "2x4", timeout_s=30,
                           config=TrainConfig(rollout_actors_per_host=3))
    with pytest.raises(ValueError, match="rollout_actors_per_host=3 does not divide"):
        third.reserve()
    assert third.slice is None and "does not divide the 8 chips" in third.status.value
    _wait_until(lambda: second.refresh() == 1)
    # The `cluster` fixture then checks that no placement group is left.


KERNEL_TRAINS = """
import workbench as wb
from workbench import ui
from workbench.engine import TrainConfig

wb.connect({address!r}, node_ip={node_ip!r})
tpu_slice = wb.reserve("v6e", "2x2", timeout_s=60, cpus_per_chip=2)
config = TrainConfig(env="workbench/CartPole-v1", mode="anakin", total_env_steps=50_000_000,
                     eval_every=0, seed=4, checkpoint_dir={checkpoints!r},
                     checkpoint_every=100_000)
run = ui.start_training(tpu_slice, config, show=False, release_slice=True)
"""


@pytest.mark.slow
def test_shutting_the_kernel_down_stops_training_checkpoints_and_releases(cluster, tmp_path):
    """A kernel shut down (JupyterLab's "Shut Down Kernel") while a run trains in it."""
    from jupyter_client.manager import start_new_kernel
    from ray._private.state import actors

    before = set(live_actors())
    checkpoints = tmp_path / "checkpoints"
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        code = KERNEL_TRAINS.format(address=cluster.address, node_ip=cluster.node_ip,
                                    checkpoints=str(checkpoints))
        reply = client.execute_interactive(code, timeout=180)
        assert reply["content"]["status"] == "ok", reply["content"]
        updates: list[str] = []
        deadline = time.monotonic() + 240
        while not updates or int(updates[-1]) < 3:
            assert time.monotonic() < deadline, "the run in the kernel did not get going"
            time.sleep(1)
            client.execute_interactive(
                "print(len(run.rows))", timeout=30,
                output_hook=lambda msg: updates.extend(
                    msg["content"].get("text", "").split()
                ),
            )
        run_actors = set(live_actors()) - before
        pids = {actors()[a]["Pid"] for a in run_actors}
        assert len(run_actors) >= 4 and all(pids)

        manager.shutdown_wait_time = 30.0  # measure how long it takes; never kill it early
        asked = time.monotonic()
        manager.shutdown_kernel(now=False)
        ended_s = time.monotonic() - asked
    finally:
        client.stop_channels()
        if manager.is_alive():
            manager.shutdown_kernel(now=True)
    assert ended_s < 15, f"the kernel took {ended_s:.1f} s to shut down"
    step = checkpoint.latest_step(str(checkpoints))
    assert step is not None and step >= 3, "no final checkpoint of the run in the kernel"
    # The slice and every actor and worker process of the run are gone.
    assert live_placement_groups() == []
    assert set(live_actors()) <= before
    deadline = time.monotonic() + 10
    while _running(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _running(pids), "worker processes of the run outlived the kernel"


def _running(pids: set[int]) -> list[int]:
    import psutil

    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive
