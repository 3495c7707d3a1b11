"""``workbench plan`` and ``wb.plan``: a run's learner compiled for a TPU slice on this
machine, without one; the refusal of a run that does not fit, as one line; the missing
compiler named by its extra; ``workbench train --check-fit`` refusing before any cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from workbench import cli
from workbench.engine.fit import roofline_seconds
from workbench.learn.ahead import bytes_in_refusal, bytes_needed
from workbench.tpu import targets

needs_libtpu = pytest.mark.skipif(not targets.libtpu_installed(),
                                  reason=f"libtpu is not installed: {targets.EXTRA}")
FIELDS = {"compiled_for", "fits", "hbm_bytes_per_chip", "hbm_capacity_bytes",
          "flops_per_update", "bytes_per_update", "estimated_update_s", "programs"}
# PQN's two 65536-wide layers: a 16 GiB weight matrix, and Adam's two moments beside it.
TOO_BIG = ["--algo", "pqn", "--hidden-sizes", "65536,65536", "--envs-per-chip", "4",
           "--rollout-length", "8"]


@pytest.fixture
def jax_platforms_kept():
    """``workbench plan`` pins its process's JAX to the CPU; here that process is pytest's,
    so the setting is put back."""
    import jax

    before = jax.config.jax_platforms
    yield
    jax.config.update("jax_platforms", before)


def _cli(*args: str, env: dict | None = None, code: str | None = None):
    command = ([sys.executable, "-c", code] if code
               else [sys.executable, "-m", "workbench.cli", *args])
    return subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_the_roofline_is_whichever_of_compute_and_bandwidth_binds():
    assert roofline_seconds(2e12, 1e9, 1e12, 1e12) == 2.0
    assert roofline_seconds(1e9, 3e12, 1e12, 1e12) == 3.0
    with pytest.raises(ValueError):
        roofline_seconds(1.0, 1.0, 0.0, 1.0)
    # Outputs written into donated arguments count once.
    assert bytes_needed(argument=100, output=80, temp=10, alias=80, code=5) == 115
    message = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for "
               "HLO temporaries (48.01G) exceeds available HBM (31.25G).")
    assert bytes_in_refusal(message) == int(48.01 * 2**30)
    assert bytes_in_refusal("Used 1.5M of 16.0G hbm") == int(1.5 * 2**20)
    assert bytes_in_refusal("no sizes here") == 0


@needs_libtpu
def test_plan_json_reports_what_the_default_run_needs_of_a_v6e_chip(capsys,
                                                                    jax_platforms_kept):
    assert cli.main(["plan", "--generation", "v6e", "--topology", "2x2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) >= FIELDS
    assert (report["compiled_for"], report["generation"], report["topology"]) == \
        ("v6e-4", "v6e", "2x2")
    assert (report["mode"], report["algo"], report["sync"], report["fits"]) == \
        ("actors", "ppo", "gradients", True)
    assert 0 < report["hbm_bytes_per_chip"] < report["hbm_capacity_bytes"] == 32 * 2**30
    assert report["flops_per_update"] > 0 and report["bytes_per_update"] > 0
    assert report["estimated_update_s"] == pytest.approx(
        max(report["flops_per_update"] / 918e12, report["bytes_per_update"] / 1638e9))
    programs = {p["name"]: p for p in report["programs"]}
    assert list(programs) == ["init", "update"]
    assert report["hbm_bytes_per_chip"] == max(p["bytes_per_chip"] for p in programs.values())
    assert report["flops_per_update"] == programs["update"]["flops"]


@needs_libtpu
def test_plan_summarises_an_anakin_run_for_people(capsys, jax_platforms_kept):
    code = cli.main(["plan", "--generation", "v5p", "--topology", "2x2x2", "--mode", "anakin",
                     "--env", "workbench/CartPole-v1", "--envs-per-chip", "8",
                     "--rollout-length", "8", "--hidden-sizes", "16"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("ppo on workbench/CartPole-v1 (anakin mode, sync gradients) "
                          "compiled for v5p-16 (v5p 2x2x2: 8 chips on 2 host(s)).")
    assert "Fits:" in out and "init_envs" in out and "roofline" in out


@needs_libtpu
def test_wb_plan_returns_the_report(tmp_path, jax_platforms_kept):
    import jax

    import workbench as wb

    jax.config.update("jax_platforms", "cpu")
    config = wb.TrainConfig(algo="impala", envs_per_chip=4, rollout_length=8,
                            run_dir=str(tmp_path / "run"))
    report = wb.plan(wb.parse_shape("v4", "2x2x1"), config)
    assert isinstance(report, wb.FitReport)
    assert report.fits and report.compiled_for == "v4-8" and report.chips == 4
    assert report.to_json()["programs"][-1]["name"] == "update"


@needs_libtpu
def test_a_run_that_does_not_fit_is_refused_in_one_line():
    done = _cli("plan", "--generation", "v6e", "--topology", "2x2", *TOO_BIG)
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("workbench: pqn on CartPole-v1 in actors mode does not fit a "
                               "v6e 2x2 slice (v6e-4): its learner needs 48.010 GiB per chip")
    assert "a chip has 32.000 GiB (34359738368 bytes) of HBM" in lines[0]
    assert "Traceback" not in done.stderr


@needs_libtpu
def test_train_check_fit_refuses_before_any_cluster_starts(tmp_path):
    done = _cli("train", "--generation", "v6e", "--topology", "2x2", "--check-fit", *TOO_BIG,
                env={"WORKBENCH_RUNS": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "Starting a simulated cluster" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("workbench: pqn on CartPole-v1 in actors mode does not fit")
    assert "34359738368 bytes" in last


def test_plan_without_libtpu_names_the_extra():
    # libtpu hidden from this process: the import system answers None for it.
    code = ("import sys; sys.modules['libtpu'] = None\n"
            "from workbench.cli import main\n"
            "raise SystemExit(main(['plan', '--generation', 'v6e', '--topology', '2x2']))")
    env = {k: v for k, v in os.environ.items() if k != "TPU_LIBRARY_PATH"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip() == ("workbench: workbench plan needs libtpu, which is not "
                                   "installed: pip install 'tpu-rl-workbench[tpu]'.")
