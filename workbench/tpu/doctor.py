"""``workbench doctor``: pre-flight checks before reserving a slice.

Each check returns findings of one line each, with what to do about anything not ok.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Finding:
    level: str  # "ok", "warn" or "error"
    message: str

    def __str__(self) -> str:
        return f"[{self.level:>5}] {self.message}"


def _cluster_versions() -> tuple[str, str]:
    import ray

    @ray.remote(num_cpus=0)
    def versions() -> tuple[str, str]:
        import platform

        import ray as cluster_ray

        return cluster_ray.__version__, platform.python_version()

    return ray.get(versions.remote(), timeout=60)


def check_versions() -> list[Finding]:
    import platform

    import ray

    ray_version, python_version = _cluster_versions()
    client = (ray.__version__, platform.python_version())
    if (ray_version, python_version) == client:
        return [
            Finding("ok", f"Ray {ray_version} on Python {python_version} here and in the cluster.")
        ]
    return [
        Finding(
            "error",
            f"Version mismatch: this process has Ray {client[0]} / Python {client[1]}, the "
            f"cluster Ray {ray_version} / Python {python_version}. Install the same versions "
            "in the notebook image as in the cluster image.",
        )
    ]


def check_slices() -> list[Finding]:
    from workbench.tpu.slice import list_slices

    slices = list_slices()
    if not slices:
        return [
            Finding(
                "warn",
                "The cluster has no TPU slices (no node carries ray.io/tpu-pod-type). Add a "
                "TPU worker group (`workbench gke`) or use wb.local_cluster().",
            )
        ]
    findings = []
    for info in slices:
        level = "ok" if info.intact else "warn"
        advice = "" if info.intact else " Wait for its hosts to come back or recreate it."
        findings.append(Finding(level, f"Slice {info.summary()}.{advice}"))
    return findings


def _process_holds_tpu() -> bool:
    for fd in glob.glob("/proc/self/fd/*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(("/dev/accel", "/dev/vfio/")):
            return True
    return False


def check_driver_tpu() -> list[Finding]:
    on_tpu_host = bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))
    if _process_holds_tpu():
        return [
            Finding(
                "error",
                "This process holds a TPU device (JAX was initialised here on a TPU host), so "
                "learners on this host cannot open it. Restart the kernel and keep JAX off "
                "the TPU in the notebook (JAX_PLATFORMS=cpu) or do not call JAX here.",
            )
        ]
    jax_platforms = os.environ.get("JAX_PLATFORMS", "")
    if on_tpu_host and "jax" in sys.modules and jax_platforms != "cpu":
        return [
            Finding(
                "warn",
                "JAX is imported in this process on a TPU host; its first computation would "
                "take the TPU (libtpu lock). Set JAX_PLATFORMS=cpu before importing JAX here.",
            )
        ]
    where = "a TPU host" if on_tpu_host else "a machine without TPU devices"
    return [Finding("ok", f"This process runs on {where} and holds no TPU.")]


def check_widgets() -> list[Finding]:
    try:
        version = importlib.metadata.version("jupyterlab_widgets")
    except importlib.metadata.PackageNotFoundError:
        return [
            Finding(
                "warn",
                "JupyterLab's widget extension (jupyterlab_widgets) is not installed: widgets "
                "would show as text. `pip install ipywidgets` in the JupyterLab environment.",
            )
        ]
    labext = Path(sys.prefix, "share", "jupyter", "labextensions", "@jupyter-widgets",
                  "jupyterlab-manager")
    if not labext.is_dir():
        return [
            Finding(
                "warn",
                f"jupyterlab_widgets {version} is installed but its lab extension is not in "
                f"{labext.parent}. Reinstall ipywidgets in the environment JupyterLab runs in.",
            )
        ]
    return [Finding("ok", f"JupyterLab widget extension {version} is installed.")]


def run_checks(address: str | None = None) -> list[Finding]:
    """Run every check; connects to ``address`` (or ``RAY_ADDRESS``) if not yet connected."""
    import ray

    from workbench.tpu.cluster import ClusterError, connect

    findings = check_driver_tpu() + check_widgets()
    if not ray.is_initialized():
        try:
            connect(address)
        except ClusterError as error:
            return findings + [Finding("error", str(error))]
    findings.append(Finding("ok", "The Ray cluster is reachable."))
    return findings + check_versions() + check_slices()
