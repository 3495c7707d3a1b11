"""The real-cluster path: a cluster started with plain ``ray start`` (a CPU head with a Ray
Client server, TPU hosts as separate nodes, one of them a two-host slice), joined the way a
JupyterHub notebook joins KubeRay: through ``ray://`` (and through the GCS address).

Each driver is a process of its own (the CLI, a script, a notebook kernel): a process can
be the driver of one cluster only, and this one's pytest process drives the simulator.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import papermill as pm
import pytest
from kuberay_like import start_cluster

from workbench import ui

# Every test here drives a cluster started with `ray start`: the slow tier.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
WORKBENCH = str(Path(sys.executable).with_name("workbench"))


@pytest.fixture(scope="module")
def kuberay(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("kuberay"),
                            [("v6e", "2x2"), ("v5p", "2x2x2")])
    try:
        yield cluster
    finally:
        cluster.stop()
        assert cluster.live_processes() == [], "the ray start cluster left processes behind"


def _env(cluster, **extra) -> dict:
    env = cluster.env(extra)
    env.pop("JAX_PLATFORMS", None)  # the driver's own; the hosts set theirs
    return env


@pytest.mark.parametrize("through", ["client", "gcs"])
def test_the_cli_trains_on_a_ray_start_cluster(kuberay, tmp_path, through):
    address = kuberay.client_address if through == "client" else kuberay.gcs_address
    record = tmp_path / "result.json"
    mode = ["--mode", "anakin", "--env", "workbench/CartPole-v1"] if through == "gcs" else []
    done = subprocess.run(
        [WORKBENCH, "train", "--address", address, "--generation", "v6e", "--topology", "2x2",
         "--total-env-steps", "20480", "--eval-every", "2", "--json", str(record), *mode],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env=_env(kuberay, WORKBENCH_RUNS=str(tmp_path / "runs")))
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Traceback" not in done.stderr
    result = json.loads(record.read_text())
    assert (result["chips"], result["hosts"], result["env_steps"]) == (4, 1, 20480)
    assert len(set(result["chip_state_digests"])) == 1
    assert Path(result["run_dir"]).is_relative_to(tmp_path / "runs")


DRIVER = textwrap.dedent("""
    import json, os
    import ray
    import workbench as wb
    from workbench import ui
    from workbench.tpu.doctor import run_checks
    from workbench.tpu.placement import probe_chips

    session = wb.join_or_start()          # RAY_ADDRESS, as in a JupyterHub pod
    out = {"where": session.where}
    out["slices"] = sorted(s.summary() for s in wb.list_slices())
    out["doctor_errors"] = [str(f) for f in run_checks() if f.level == "error"]
    with wb.reserve("v5p", "2x2x2", timeout_s=60) as multi_host:
        out["multi_host"] = sorted({(r.host, r.tpu_name) for r in probe_chips(multi_host)})
    picker = ui.SlicePicker("v6e", "2x2", timeout_s=60)
    tpu_slice = picker.reserve()
    name = f"{tpu_slice.name}:a0:learner-1"
    fired = []

    def lose_a_learner(row):
        if row["update"] >= 3 and not fired:
            fired.append(row["update"])
            ray.kill(ray.get_actor(name))

    # Long enough in updates (milliseconds each) that the kill lands before the last one.
    result = wb.train(tpu_slice, wb.TrainConfig(
        env="workbench/CartPole-v1", mode="anakin", total_env_steps=64 * 4096,
        checkpoint_every=2, eval_every=0), on_update=lose_a_learner)
    out["anakin"] = {"restarts": result.restarts, "updates": result.updates,
                     "digests": len(set(result.chip_state_digests))}
    picker.release()
    out["groups_left"] = [k for k, g in ray.util.placement_group_table().items()
                          if g["state"] != "REMOVED"]
    session.close()
    print("RESULT", json.dumps(out))
""")


def test_a_notebook_style_driver_does_everything_through_ray_client(kuberay, tmp_path):
    done = subprocess.run([sys.executable, "-c", DRIVER], capture_output=True, text=True,
                          timeout=900, cwd=tmp_path,
                          env=_env(kuberay, RAY_ADDRESS=kuberay.client_address,
                                   WORKBENCH_RUNS=str(tmp_path / "runs")))
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["where"] == f"the Ray cluster at {kuberay.client_address}"
    assert any("v6e 2x2" in s and "free" in s for s in out["slices"]), out["slices"]
    assert any("v5p 2x2x2" in s for s in out["slices"]), out["slices"]
    assert out["doctor_errors"] == []
    # The two-host slice: its 8 chips on hosts 0 and 1 of one slice name.
    assert [host for host, _ in out["multi_host"]] == [0, 1]
    assert len({name for _, name in out["multi_host"]}) == 1
    # A learner killed through Ray Client: the run restarted from its checkpoint.
    assert out["anakin"]["restarts"] == 1 and out["anakin"]["digests"] == 1
    assert out["groups_left"] == []


def test_the_quickstart_notebook_joins_the_cluster_through_ray_address(kuberay, tmp_path,
                                                                       monkeypatch):
    from test_notebooks import CI_PARAMETERS

    monkeypatch.setenv("RAY_ADDRESS", kuberay.client_address)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("WORKBENCH_RUNS", str(tmp_path / "runs"))
    output = tmp_path / "quickstart.ipynb"
    parameters = {**CI_PARAMETERS["01_quickstart.ipynb"], "topology": "2x2",
                  "total_env_steps": 20_480, "min_final_return": 20.0}
    pm.execute_notebook(str(ROOT / "notebooks" / "01_quickstart.ipynb"), str(output),
                        parameters=parameters, kernel_name="python3", cwd=str(tmp_path),
                        progress_bar=False, execution_timeout=600)
    recorded = ui.read_records(output)
    # The notebook's address parameter was empty: it joined RAY_ADDRESS, started nothing.
    assert recorded["cluster"] == f"the Ray cluster at {kuberay.client_address}"
    assert recorded["chips"] == 4 and recorded["final_return"] >= 20.0
    assert not (tmp_path / "wb-").exists()
    assert os.environ["RAY_ADDRESS"] == kuberay.client_address
