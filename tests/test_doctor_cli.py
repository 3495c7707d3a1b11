"""`workbench doctor` against the simulated cluster, and the catalog on the command line."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest
import ray

from workbench.tpu.doctor import check_driver_tpu, check_widgets, run_checks


@pytest.mark.slow
def test_doctor_reports_versions_and_every_slice(cluster):
    findings = run_checks()
    text = "\n".join(str(f) for f in findings)
    assert all(f.level == "ok" for f in findings), text
    versions = f"Ray {ray.__version__} on Python {platform.python_version()}"
    # After this process's own checks: the cluster, its versions, and every slice of the
    # session cluster (in the order list_slices gives), each with its hosts, and free.
    assert [f.message for f in findings[2:]] == [
        "The Ray cluster is reachable.",
        f"{versions} here and in the cluster.",
        "Slice sim-v5p-16-4 (v5p 2x2x2, v5p-16, 2/2 hosts, free).",
        "Slice sim-v6e-4-2 (v6e 2x2, v6e-4, 1/1 hosts, free).",
        "Slice sim-v6e-4-3 (v6e 2x2, v6e-4, 1/1 hosts, free).",
        "Slice sim-v6e-8-1 (v6e 2x4, v6e-8, 1/1 hosts, free).",
        "Slice sim-v6e-16-0 (v6e 4x4, v6e-16, 4/4 hosts, free).",
    ], text


def test_doctor_says_this_process_holds_no_tpu_and_widgets_are_installed():
    assert check_driver_tpu()[0].level == "ok"
    assert check_widgets()[0].level == "ok"


def _workbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True,
                          text=True, timeout=120)


def test_topologies_table_and_json():
    table = _workbench("topologies", "--generation", "v6e")
    assert table.returncode == 0
    row = next(line for line in table.stdout.splitlines() if line.startswith("v6e  4x4"))
    assert row.split()[:5] == ["v6e", "4x4", "v6e-16", "16", "4"]
    assert "tpu-v6e-slice" in row
    shapes = json.loads(_workbench("topologies", "--json").stdout)
    assert {s["generation"] for s in shapes} == {"v4", "v5e", "v5p", "v6e", "v7x"}


def test_bad_generation_on_the_command_line_is_one_clear_line():
    result = _workbench("topologies", "--generation", "v9")
    assert result.returncode == 2
    assert "Unknown TPU generation 'v9'" in result.stderr and "Traceback" not in result.stderr


def test_doctor_without_any_address_says_what_to_do(monkeypatch):
    env_free = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "doctor"], capture_output=True, text=True,
        timeout=120, env={k: v for k, v in __import__("os").environ.items() if k != "RAY_ADDRESS"},
    )
    assert env_free.returncode == 1
    assert "No Ray cluster address" in env_free.stdout and "local_cluster" in env_free.stdout


@pytest.mark.slow
def test_a_command_reaches_the_simulated_cluster_by_its_loopback_address(cluster):
    """A second process (a terminal beside the notebook that started the cluster) joins by
    the address alone: it is known by the loopback address too, so Ray does not name it by
    the machine's external IP, which a loopback cluster cannot reach."""
    done = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "doctor", "--address", cluster.address],
        capture_output=True, text=True, timeout=120,
        env={k: v for k, v in __import__("os").environ.items() if k != "RAY_ADDRESS"},
    )
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "sim-v6e-16-0 (v6e 4x4" in done.stdout
