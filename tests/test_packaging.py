"""The project as a user installs it into an environment of their own: a wheel built from
the checkout, installed with its ``notebook`` extra into a fresh virtual environment, runs
``workbench demo`` from a directory that is not the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).with_name("uv")


def _run(command: list, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True,
                          timeout=1500, **kwargs)
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", out, ROOT])
    (built,) = out.glob("tpu_rl_workbench-*.whl")
    return built


def test_the_wheel_holds_every_package_the_envs_and_the_license(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    packages = [p.parent.relative_to(ROOT) for p in (ROOT / "workbench").rglob("__init__.py")]
    packages += [Path("workbench/envs")]
    for package in packages:
        assert f"{package.as_posix()}/__init__.py" in names, f"{package} is not in the wheel"
    assert "workbench/envs/cartpole.py" in names
    # The top-level envs/ folder installs as workbench.envs, never as a package `envs`.
    assert not any(name.startswith("envs/") for name in names)
    assert any(name.endswith("licenses/LICENSE") for name in names)
    assert not any("/tests/" in name or name.startswith("tests/") for name in names)


@pytest.mark.slow
def test_a_fresh_environment_from_the_wheel_runs_the_demo_elsewhere(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv])
    python, workbench = venv / "bin" / "python", venv / "bin" / "workbench"
    # uv: the wheel's own requirements from the package index, as pip would install them,
    # in a tenth of pip's time here. What is under test is the wheel and its metadata.
    _run([UV, "pip", "install", "--quiet", "--python", python, f"{wheel}[notebook]"])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "RAY_ADDRESS", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    # What the notebooks import comes with the notebook extra, from this environment.
    where = _run([python, "-c", "import workbench, workbench.envs, papermill, jupyterlab, "
                  "ipywidgets; print(workbench.__file__); print(workbench.envs.__file__)"],
                 cwd=elsewhere, env=env).stdout.split()
    assert all(Path(p).is_relative_to(venv) for p in where), where
    version = _run([workbench, "--version"], cwd=elsewhere, env=env).stdout.strip()
    assert version == "workbench 0.1.0"
    demo = _run([workbench, "demo", "--total-env-steps", "40000"], cwd=elsewhere, env=env)
    assert "greedy return" in demo.stdout and "over a simulated slice" in demo.stdout
    assert "Traceback" not in demo.stderr
    assert list(elsewhere.iterdir()) == [], "the demo left files in the working directory"
