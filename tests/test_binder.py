"""The Binder path: an environment built from ``binder/`` alone runs the quickstart.

mybinder.org builds its image with repo2docker from ``binder/runtime.txt``,
``binder/requirements.txt`` and ``binder/postBuild``. Docker is not available to the tests,
so this builds the nearest thing: a fresh virtual environment with exactly those pins (none
of the project's dev extras), the project installed by ``postBuild`` from a copy of the
checkout, and a Jupyter kernel of that environment executing the quickstart through
papermill. As on Binder, the notebook starts its own simulated cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import papermill as pm
import pytest
from test_notebooks import CI_PARAMETERS, _check_bars

from workbench import ui

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"
UV = Path(sys.executable).with_name("uv")
KERNEL = "workbench-binder"
# The repo2docker release whose base environment the Binder files are checked against
# (mybinder.org builds with a recent repo2docker; its wheel carries the conda locks).
REPO2DOCKER = "jupyter-repo2docker==2026.4.0"
# The Jupyter stack of repo2docker's base environment, by conda name -> pip name: what
# requirements.txt is installed on top of, and must not need to change.
JUPYTER_STACK = {
    "jupyterlab": "jupyterlab", "notebook": "notebook", "jupyter_server": "jupyter-server",
    "jupyterhub-base": "jupyterhub", "ipykernel": "ipykernel", "ipython": "ipython",
    "jupyter_client": "jupyter-client", "jupyter_core": "jupyter-core",
    "jupyterlab_server": "jupyterlab-server", "jupyterlab_widgets": "jupyterlab-widgets",
    "notebook-shim": "notebook-shim", "jupyter-lsp": "jupyter-lsp",
    "jupyter_events": "jupyter-events", "nbformat": "nbformat", "tornado": "tornado",
    "traitlets": "traitlets", "pyzmq": "pyzmq", "jupyter-resource-usage": "jupyter-resource-usage",
}
# Build outputs and local state that a fresh clone would not have.
NOT_IN_A_CLONE = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                        ".ruff_cache", ".pytest_cache")


def _run(command: list[str], **kwargs) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200, **kwargs)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def repo2docker_base(tmp_path_factory) -> dict[str, str]:
    """repo2docker's own pins of its base environment's Jupyter stack (pip names), read
    from the conda lock its published wheel carries for ``binder/runtime.txt``'s Python."""
    import zipfile

    python = (BINDER / "runtime.txt").read_text().strip().removeprefix("python-")
    folder = tmp_path_factory.mktemp("repo2docker")
    _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(folder),
          REPO2DOCKER])
    (wheel,) = folder.glob("jupyter_repo2docker-*.whl")
    lock = zipfile.ZipFile(wheel).read(
        f"repo2docker/buildpacks/conda/environment.py-{python}-linux-64.lock").decode()
    pins = {}
    for line in lock.splitlines():
        if not line.startswith("https://"):
            continue
        # .../noarch/jupyterlab-4.4.9-pyhd8ed1ab_0.conda#md5: name-version-build
        name, version, _ = line.rsplit("/", 1)[-1].split("#")[0].rsplit("-", 2)
        if name in JUPYTER_STACK:
            pins[JUPYTER_STACK[name]] = version
    assert {"jupyterlab", "notebook", "jupyter-server", "ipykernel"} <= set(pins), pins
    return pins


def test_binder_requirements_resolve_on_repo2dockers_base_environment(repo2docker_base,
                                                                      tmp_path):
    """What repo2docker does: its base environment first (its JupyterLab and notebook),
    then `pip install -r binder/requirements.txt` on top. pip's resolver must find every
    pin compatible with that Jupyter stack, changing none of it."""
    constraints = tmp_path / "base.txt"
    constraints.write_text("".join(f"{n}=={v}\n" for n, v in repo2docker_base.items()))
    report = tmp_path / "report.json"
    _run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
          "--quiet", "--report", str(report), "-r", str(BINDER / "requirements.txt"),
          "-r", str(constraints), "-c", str(constraints)])
    import json

    resolved = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
                for item in json.loads(report.read_text())["install"]}
    for name, version in repo2docker_base.items():
        assert resolved.get(name) == version, (name, resolved.get(name), version)


@pytest.fixture(scope="module")
def binder_env(tmp_path_factory, repo2docker_base) -> dict:
    """A virtual environment made the way repo2docker makes Binder's: its base Jupyter
    stack, then ``binder/`` alone, with a Jupyter kernel of its own."""
    base = tmp_path_factory.mktemp("binder")
    checkout = base / "repo"
    shutil.copytree(ROOT, checkout, ignore=NOT_IN_A_CLONE)
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    pins = base / "repo2docker-base.txt"
    pins.write_text("".join(f"{n}=={v}\n" for n, v in repo2docker_base.items()))
    # uv installs the packages pip would pick for the same pins (pip's own resolution of
    # them is checked above), in a fraction of the time; postBuild then runs its own pip.
    _run([str(UV), "pip", "install", "--quiet", "--python", str(python), "-r", str(pins)])
    _run([str(UV), "pip", "install", "--quiet", "--python", str(python),
          "-r", str(checkout / "binder" / "requirements.txt"), "-c", str(pins)])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    _run([str(checkout / "binder" / "postBuild")], env=env, cwd=base)
    kernels = base / "jupyter"
    _run([str(python), "-m", "ipykernel", "install", "--prefix", str(kernels), "--name", KERNEL])
    return {"python": python, "jupyter_path": kernels / "share" / "jupyter", "cwd": base}


def test_binder_files_pin_every_runtime_dependency_of_the_project():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = {}
    for line in (BINDER / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"binder/requirements.txt: {line!r} is not pinned with =="
            pinned[name.split("[")[0].lower().replace("_", "-")] = version
    for requirement in project["dependencies"]:
        name = requirement.split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip()
        assert name.lower().replace("_", "-") in pinned, \
            f"binder/requirements.txt does not pin {name}"
    assert (BINDER / "runtime.txt").read_text().strip().startswith("python-3.")
    assert os.access(BINDER / "postBuild", os.X_OK), "repo2docker runs postBuild only if executable"


@pytest.mark.slow
def test_the_quickstart_runs_in_an_environment_built_from_the_binder_files(binder_env,
                                                                            monkeypatch):
    python, cwd = binder_env["python"], binder_env["cwd"]
    # The workbench the kernel imports is the one postBuild installed, not this checkout.
    where = _run([str(python), "-c", "import workbench; print(workbench.__file__)"], cwd=cwd)
    assert Path(where.strip()).is_relative_to(python.parents[1])
    # None of the project's dev extras came along.
    missing = subprocess.run([str(python), "-c", "import pytest"], capture_output=True)
    assert missing.returncode != 0

    monkeypatch.setenv("JUPYTER_PATH", str(binder_env["jupyter_path"]))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    output = ROOT / "build" / "notebooks" / "binder-01_quickstart.ipynb"
    output.parent.mkdir(parents=True, exist_ok=True)
    pm.execute_notebook(
        str(ROOT / "notebooks" / "01_quickstart.ipynb"), str(output),
        parameters=CI_PARAMETERS["01_quickstart.ipynb"], kernel_name=KERNEL, cwd=str(cwd),
        progress_bar=False, execution_timeout=600,
    )
    recorded = ui.read_records(output)
    assert recorded["chips"] == 1 and recorded["env_steps"] > 0
    _check_bars("01_quickstart.ipynb", recorded)
