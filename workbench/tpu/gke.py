"""Deployment files for GKE: a KubeRay ``RayCluster`` of TPU slices, zero-to-jupyterhub
Helm values whose notebooks find that cluster, and the one image both run.

Everything about the slice comes from the catalog (:mod:`workbench.tpu.catalog`); this module only
decides how to lay it out on Kubernetes. Pure functions render the files; ``write_files``
and the ``workbench gke`` subcommand put them on disk after every input has been checked.

What the rendered manifest relies on (from KubeRay's, Ray's and Google's documentation,
read 2026):

- KubeRay (v1.1 and later) gives a worker group a ``numOfHosts`` field: each replica of the
  group is one TPU slice of ``numOfHosts`` pods, created and scaled as a unit. So
  ``replicas`` counts slices and ``numOfHosts`` is the catalog's hosts per slice.
  (docs.ray.io, "Use TPUs with KubeRay")
- Each TPU pod asks for ``google.com/tpu`` in both requests and limits, equal to the chips of
  one host, and is steered onto the right TPU VMs by the node selectors
  ``cloud.google.com/gke-tpu-accelerator`` and ``cloud.google.com/gke-tpu-topology``.
  GKE taints TPU nodes and adds the matching toleration to pods that request TPUs, so the
  manifest carries none. A multi-host slice is its own node pool of exactly ``hosts`` nodes.
  (cloud.google.com/kubernetes-engine/docs/how-to/tpus)
- The Ray TPU webhook, which GKE's Ray Operator add-on installs (GKE 1.30.0-gke.1747000 and
  later), assigns every TPU pod of a RayCluster to a slice replica and injects
  ``TPU_WORKER_ID``, ``TPU_NAME`` (``<group>-<replica index>``) and, for multi-host slices,
  ``TPU_WORKER_HOSTNAMES`` plus a hostname under the ``<cluster>-headless-worker-svc``
  subdomain. It also refuses a RayCluster whose ``numOfHosts`` disagrees with the topology
  and the chips per pod. It only fills in variables the pod spec leaves unset, so the
  manifest must not set them. (GoogleCloudPlatform/ai-on-gke, ray-on-gke/tpu/kuberay-tpu-webhook)
- GKE's TPU device plugin sets ``TPU_ACCELERATOR_TYPE`` (the pod type, e.g. ``v6e-16``) and
  ``TPU_TOPOLOGY``; Ray reads those and ``TPU_NAME``/``TPU_WORKER_ID`` to give each host its
  ``TPU`` resource, the ``TPU-<pod type>-head`` resource on worker 0 and the ``ray.io/tpu-*``
  node labels that :mod:`workbench.tpu.slice` reserves by: the simulated cluster copies exactly
  this. (ray/_private/accelerators/tpu.py)
- Ports on TPU pods: 8471 is the port libtpu uses between the hosts of a slice, 8431 is where
  the TPU runtime exports the metrics GKE collects, and 8081 is Ray's default MegaScale
  coordinator port for multislice jobs. (GKE TPU workload examples; ray.util.tpu)
- KubeRay caps a RayCluster name at 53 characters and requires a DNS-1035 label; the
  webhook's hostnames name the ``<cluster>-headless-worker-svc`` service, which must stay
  within 63 characters untruncated, so names here stop at 43.
- Notebooks are not Ray nodes, so they reach the cluster through Ray Client at
  ``ray://<cluster>-head-svc.<namespace>.svc.cluster.local:10001`` (KubeRay names the head
  service ``<cluster>-head-svc`` and exposes the client port 10001 on it).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from workbench.tpu.catalog import SliceShape, parse_shape

DEFAULT_NAME = "workbench"
DEFAULT_NAMESPACE = "workbench"
# A placeholder: push the image to your own registry and pass its name with --image.
DEFAULT_IMAGE = "us-docker.pkg.dev/my-project/workbench/tpu-rl-workbench:0.1.0"
MAX_SLICES = 64
# Per chip of a TPU host. Sized to fit the smallest TPU VM in the catalog (a v5e host with
# 4 chips: 112 vCPUs, 192 GB) after GKE's own reservations, while leaving each chip a
# learner and several rollout actors.
CPUS_PER_CHIP = 8
MEMORY_GIB_PER_CHIP = 32
HEAD_CPUS = 4
HEAD_MEMORY = "16Gi"
PYTHON_VERSION = "3.11"
RAY_CLIENT_PORT = 10001
FILES = ("raycluster.yaml", "ray-networkpolicy.yaml", "jupyterhub-values.yaml", "Dockerfile",
         "Dockerfile.dockerignore")
# Seconds Kubernetes waits between SIGTERM and SIGKILL. A training run stops after its
# current update, checkpoints and releases its slice within workbench.engine.stops's 20 s;
# this leaves Ray's own shutdown room too.
TERMINATION_GRACE_S = 60
# What the image's Dockerfile runs as (JupyterHub's single-user convention).
RUN_AS_USER, RUN_AS_GROUP = 1000, 100

_PACKAGE = "tpu-rl-workbench"
# KubeRay takes names up to 53 characters, but the webhook's hostnames name the
# `<cluster>-headless-worker-svc` service, which must stay a 63-character DNS label.
_MAX_CLUSTER_NAME = 63 - len("-headless-worker-svc")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"^(?P<name>(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*)"
    r":(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)


class GkeConfigError(ValueError):
    """A deployment setting (slices, image, name, namespace, output folder) is not usable."""


@dataclass(frozen=True)
class GkeDeployment:
    """One RayCluster of identical TPU slices and the JupyterHub that uses it."""

    shape: SliceShape
    """The catalog shape of every slice."""
    slices: int
    """How many slices of that shape the cluster holds (worker group replicas)."""
    image: str
    """The image head, TPU hosts and single-user pods all run (``name:tag``, optionally
    ``@sha256:…`` pinned)."""
    namespace: str
    """Kubernetes namespace of the RayCluster."""
    name: str
    """Name of the RayCluster; its services are named after it."""
    ray_version: str
    """The Ray release the image carries: the project's pinned ``ray``."""

    @property
    def group_name(self) -> str:
        """The TPU worker group; the webhook names slices ``<group>-<replica index>``."""
        return f"{self.shape.generation.name}-{self.shape.topology}"

    @property
    def head_service(self) -> str:
        """Cluster-wide DNS name of the Ray head service KubeRay creates."""
        return f"{self.name}-head-svc.{self.namespace}.svc.cluster.local"

    @property
    def ray_address(self) -> str:
        """The Ray Client address notebooks connect to (``RAY_ADDRESS``)."""
        return f"ray://{self.head_service}:{RAY_CLIENT_PORT}"

    @property
    def command(self) -> str:
        """The ``workbench gke`` invocation that renders exactly these files."""
        return (
            f"workbench gke --generation {self.shape.generation.name} "
            f"--topology {self.shape.topology} --slices {self.slices} --image {self.image} "
            f"--namespace {self.namespace} --name {self.name}"
        )


def pinned_ray_version() -> str:
    """The exact Ray release the installed workbench pins (``ray==X`` in its requirements).

    Returns:
        The version string, e.g. ``"2.60.0"``.

    Raises:
        GkeConfigError: the workbench is not installed as a package, or pins no exact Ray.
    """
    try:
        requirements = importlib.metadata.requires(_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        raise GkeConfigError(
            f"The {_PACKAGE} package is not installed, so its Ray pin is unknown. Install "
            "it (`pip install -e .` in the repository) and run again."
        ) from None
    for requirement in requirements:
        match = re.fullmatch(r"ray(?:\[[^\]]*\])?\s*==\s*([0-9][0-9A-Za-z.+-]*)", requirement)
        if match:
            return match.group(1)
    raise GkeConfigError(
        f"{_PACKAGE} pins no exact Ray version (found {requirements}); the image and the "
        "RayCluster need one. Pin ray with '==' in pyproject.toml and reinstall."
    )


def _check_slices(slices: object) -> int:
    if isinstance(slices, bool) or not isinstance(slices, int) or not 1 <= slices <= MAX_SLICES:
        raise GkeConfigError(
            f"Number of slices must be a whole number from 1 to {MAX_SLICES}, got {slices!r}. "
            "Each slice is one worker-group replica (and, for multi-host shapes, one GKE "
            "node pool); pass --slices 1 for a single slice."
        )
    return slices


def _check_label(value: object, what: str, pattern: re.Pattern[str], limit: int, rule: str) -> str:
    if not isinstance(value, str) or len(value) > limit or not pattern.fullmatch(value):
        shown = value if not isinstance(value, str) else f"{value!r} ({len(value)} characters)"
        raise GkeConfigError(
            f"{what} {shown} is not valid: it must be {rule}, at most {limit} characters. "
            f"For example {DEFAULT_NAME!r}."
        )
    return value


def _check_image(image: object) -> str:
    if not isinstance(image, str) or not _IMAGE.fullmatch(image):
        raise GkeConfigError(
            f"Image {image!r} is not a tagged image reference. Give REGISTRY/PATH:TAG in "
            f"lowercase, e.g. {DEFAULT_IMAGE!r}, optionally pinned by digest "
            "(REGISTRY/PATH:TAG@sha256:<64 hex digits>, what `docker push` prints); a tag "
            "is required so that the head, every TPU host and every notebook run the same "
            "build."
        )
    return image


def deployment(
    generation: object,
    topology: object,
    *,
    slices: object = 1,
    image: object = DEFAULT_IMAGE,
    namespace: object = DEFAULT_NAMESPACE,
    name: object = DEFAULT_NAME,
) -> GkeDeployment:
    """Check every setting and return the deployment to render.

    Args:
        generation: TPU generation, any spelling the catalog accepts (``v6e``, ``TPU-V6E``).
        topology: slice topology valid for that generation (``4x4``).
        slices: number of identical slices, 1 to ``MAX_SLICES``.
        image: ``REGISTRY/PATH:TAG`` of the image built from the rendered Dockerfile.
        namespace: Kubernetes namespace of the RayCluster (a DNS-1123 label).
        name: RayCluster name (a DNS-1035 label of at most 43 characters).

    Returns:
        The validated deployment.

    Raises:
        CatalogError: the generation or topology is not in the catalog.
        GkeConfigError: slices, image, namespace or name is not usable; the message says
            what is valid.
    """
    shape = parse_shape(generation, topology)
    return GkeDeployment(
        shape=shape,
        slices=_check_slices(slices),
        image=_check_image(image),
        namespace=_check_label(
            namespace, "Namespace", _DNS1123, 63,
            "a DNS-1123 label: lowercase letters, digits and '-', starting and ending with "
            "a letter or digit",
        ),
        name=_check_label(
            name, "Cluster name", _DNS1035, _MAX_CLUSTER_NAME,
            "a DNS-1035 label as KubeRay requires: lowercase letters, digits and '-', "
            "starting with a letter and ending with a letter or digit",
        ),
        ray_version=pinned_ray_version(),
    )


def _labels(dep: GkeDeployment) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": _PACKAGE,
        "app.kubernetes.io/instance": dep.name,
    }


def container_security() -> dict:
    """Least privilege for every container: not root, no privilege escalation, no Linux
    capabilities. GKE's TPU device plugin gives a pod its chips without privileged mode
    (GKE 1.28 and later)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_GROUP,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _pod_template(dep: GkeDeployment, container: str, resources: dict[str, str],
                  ports: dict[str, int], node_selector: dict[str, str] | None = None,
                  env: list[dict] | None = None) -> dict:
    """A Ray pod: one container of the deployment's image with equal requests and limits,
    least privilege, a grace period a training run can checkpoint in, and a memory-backed
    /dev/shm (Ray's object store lives there; a container's default one is only 64 MiB)."""
    spec: dict = {"nodeSelector": dict(node_selector)} if node_selector else {}
    spec["terminationGracePeriodSeconds"] = TERMINATION_GRACE_S
    spec["securityContext"] = {"fsGroup": RUN_AS_GROUP}
    body = {
        "name": container,
        "image": dep.image,
        "resources": {"requests": resources, "limits": dict(resources)},
        "ports": [{"name": name, "containerPort": port} for name, port in ports.items()],
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        "securityContext": container_security(),
    }
    if env:
        body["env"] = env
    spec["containers"] = [body]
    spec["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    return {"metadata": {"labels": _labels(dep)}, "spec": spec}


def tpu_worker_env() -> list[dict]:
    """The environment KubeRay's own TPU samples give a TPU worker: the node's address,
    the TPU runtime's control service on it, JAX on the TPU (CPU as fallback), and PJRT
    compatibility for the TPU plugin. TPU_NAME, TPU_WORKER_ID, TPU_WORKER_HOSTNAMES,
    TPU_ACCELERATOR_TYPE and TPU_TOPOLOGY are left to the webhook and the device plugin."""
    return [
        {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        {"name": "VBAR_CONTROL_SERVICE_URL", "value": "$(NODE_IP):8353"},
        {"name": "JAX_PLATFORMS", "value": "tpu,cpu"},
        {"name": "ENABLE_PJRT_COMPATIBILITY", "value": "true"},
    ]


def _head_group(dep: GkeDeployment) -> dict:
    resources = {"cpu": str(HEAD_CPUS), "memory": HEAD_MEMORY}
    ports = {"gcs-server": 6379, "dashboard": 8265, "client": RAY_CLIENT_PORT, "metrics": 8080}
    return {
        "serviceType": "ClusterIP",
        "rayStartParams": {
            # Nothing of a training run belongs on the head: learners and rollout actors
            # must land on TPU hosts, and the head keeps its CPUs for the notebooks'
            # Ray Client drivers.
            "num-cpus": "0",
            # The dashboard has no authentication; keep it inside the head pod, where
            # KubeRay's probes and `kubectl port-forward` still reach it.
            "dashboard-host": "127.0.0.1",
        },
        "template": _pod_template(dep, "ray-head", resources, ports),
    }


def _tpu_group(dep: GkeDeployment) -> dict:
    shape = dep.shape
    chips = shape.chips_per_host
    resources = {
        "cpu": str(CPUS_PER_CHIP * chips),
        "memory": f"{MEMORY_GIB_PER_CHIP * chips}Gi",
        "google.com/tpu": str(chips),
    }
    # TPU_WORKER_ID, TPU_NAME and TPU_WORKER_HOSTNAMES are left to the webhook, which
    # skips any the spec already sets.
    ports = {"tpu-runtime": 8471, "tpu-metrics": 8431, "megascale": 8081}
    return {
        "groupName": dep.group_name,
        "replicas": dep.slices,
        "minReplicas": dep.slices,
        "maxReplicas": dep.slices,
        "numOfHosts": shape.hosts,
        "rayStartParams": {},
        "template": _pod_template(dep, "ray-worker", resources, ports,
                                  node_selector=shape.gke_node_selector, env=tpu_worker_env()),
    }


def raycluster_manifest(dep: GkeDeployment) -> dict:
    """The KubeRay ``RayCluster`` (``ray.io/v1``) for the deployment.

    Args:
        dep: a deployment from :func:`deployment`.

    Returns:
        The manifest as plain data: a CPU-only head and one TPU worker group with one
        replica per slice and ``numOfHosts`` pods per replica.
    """
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": dep.name, "namespace": dep.namespace, "labels": _labels(dep)},
        "spec": {
            "rayVersion": dep.ray_version,
            "headGroupSpec": _head_group(dep),
            "workerGroupSpecs": [_tpu_group(dep)],
        },
    }


def network_policy(dep: GkeDeployment) -> dict:
    """Ingress to the Ray pods of the deployment only from its own Ray pods, and from its
    JupyterHub single-user pods to the head's Ray Client port (``ray.io/cluster`` is the
    label KubeRay puts on every pod of a RayCluster)."""
    ray_pods = {"podSelector": {"matchLabels": {"ray.io/cluster": dep.name}}}
    notebooks = {"podSelector": {"matchLabels": {"component": "singleuser-server"}}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{dep.name}-ray", "namespace": dep.namespace,
                     "labels": _labels(dep)},
        "spec": {
            "podSelector": {"matchLabels": {"ray.io/cluster": dep.name}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [ray_pods]},
                {"from": [notebooks],
                 "ports": [{"port": RAY_CLIENT_PORT, "protocol": "TCP"}]},
            ],
        },
    }


def jupyterhub_values(dep: GkeDeployment) -> dict:
    """zero-to-jupyterhub Helm values: single-user pods on the workbench image with
    ``RAY_ADDRESS`` set, so ``workbench.connect()`` finds the cluster with no arguments.

    Args:
        dep: a deployment from :func:`deployment`.

    Returns:
        The values as plain data.
    """
    reference, _, digest = dep.image.partition("@")
    image_name, _, tag = reference.rpartition(":")
    # The chart joins name and tag with ":"; a digest rides on the tag ("TAG@sha256:...").
    tag = f"{tag}@{digest}" if digest else tag
    head_pods = {
        "podSelector": {
            "matchLabels": {"ray.io/cluster": dep.name, "ray.io/node-type": "head"}
        },
        "namespaceSelector": {
            "matchLabels": {"kubernetes.io/metadata.name": dep.namespace}
        },
    }
    copy_notebooks = (
        "test -d /opt/workbench/notebooks && test ! -e \"$HOME/notebooks\" && "
        "cp -r /opt/workbench/notebooks \"$HOME/notebooks\"; exit 0"
    )
    return {
        "hub": {
            "config": {
                # Anyone who reaches the hub may log in: it is only reachable through
                # `kubectl port-forward` (the proxy service is ClusterIP). Configure a real
                # authenticator before exposing it.
                "JupyterHub": {"authenticator_class": "dummy"},
                "Authenticator": {"allow_all": True},
            }
        },
        "proxy": {"service": {"type": "ClusterIP"}},
        "singleuser": {
            "image": {"name": image_name, "tag": tag},
            "defaultUrl": "/lab",
            # A notebook that trains gets SIGTERM on eviction; it stops the run with a
            # checkpoint and releases its slice before this runs out.
            "extraPodConfig": {"terminationGracePeriodSeconds": TERMINATION_GRACE_S},
            "extraEnv": {"RAY_ADDRESS": dep.ray_address},
            "cpu": {"guarantee": 1, "limit": 2},
            "memory": {"guarantee": "4G", "limit": "8G"},
            "lifecycleHooks": {
                "postStart": {"exec": {"command": ["sh", "-c", copy_notebooks]}}
            },
            "networkPolicy": {
                # The chart's default egress policy blocks private addresses, which
                # include the Ray head; open only its Ray Client port.
                "egress": [
                    {
                        "to": [head_pods],
                        "ports": [{"port": RAY_CLIENT_PORT, "protocol": "TCP"}],
                    }
                ]
            },
        },
    }


def dockerfile(dep: GkeDeployment) -> str:
    """The Dockerfile of the one image the head, TPU hosts and notebooks share.

    Args:
        dep: a deployment from :func:`deployment`.

    Returns:
        Dockerfile text; it is built from the repository root.
    """
    return f"""\
# syntax=docker/dockerfile:1
# One image for the Ray head, the TPU hosts and the JupyterHub single-user pods.
# Generated by: {dep.command}
# Build from the repository root and push:
#   docker build -f path/to/this/Dockerfile -t {dep.image} .
#   docker push {dep.image}
FROM python:{PYTHON_VERSION}-slim-bookworm

# KubeRay's health probes call wget.
RUN apt-get update \\
    && apt-get install -y --no-install-recommends wget ca-certificates \\
    && rm -rf /var/lib/apt/lists/*

# JupyterHub's single-user pods run as uid 1000 with group 100 and home /home/jovyan.
RUN useradd --uid 1000 --gid 100 --create-home --shell /bin/bash jovyan

COPY --chown=1000:100 . /opt/workbench
# The Ray pin must match the RayCluster's rayVersion; jax[tpu] brings libtpu for the TPU
# hosts (unused on the CPU-only head and notebook pods); jupyterhub provides
# jupyterhub-singleuser for the notebook pods (major version of the chart's hub: the
# zero-to-jupyterhub 4.x chart runs JupyterHub 5).
RUN pip install --no-cache-dir \\
    "/opt/workbench[notebook]" \\
    "ray[default]=={dep.ray_version}" \\
    "jax[tpu]" \\
    "jupyterhub>=5,<6"

USER 1000
ENV HOME=/home/jovyan
WORKDIR /home/jovyan
"""


def dockerignore() -> str:
    """What the image build leaves out of the repository.

    Returns:
        The text of ``Dockerfile.dockerignore``; BuildKit reads an ignore file of that
        name next to the Dockerfile given with ``-f``.
    """
    return "\n".join([
        "# Keep local environments, caches and history out of the image.",
        ".git", ".venv", "**/__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache",
        ".ipynb_checkpoints", "",
    ])


def _yaml_text(dep: GkeDeployment, data: dict, what: str) -> str:
    header = (
        f"# {what} for {dep.slices} x TPU {dep.shape.label} ({dep.shape.pod_type}: "
        f"{dep.shape.hosts} host(s) x {dep.shape.chips_per_host} chips).\n"
        f"# Generated by: {dep.command}\n"
        "# Do not edit by hand: change the command and run it again.\n"
    )
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def render(dep: GkeDeployment) -> dict[str, str]:
    """Every deployment file's text.

    Args:
        dep: a deployment from :func:`deployment`.

    Returns:
        File name (``FILES``, in that order) to text.
    """
    return {
        "raycluster.yaml": _yaml_text(dep, raycluster_manifest(dep), "KubeRay RayCluster"),
        "ray-networkpolicy.yaml": _yaml_text(dep, network_policy(dep),
                                             "NetworkPolicy for the Ray pods"),
        "jupyterhub-values.yaml": _yaml_text(
            dep, jupyterhub_values(dep), "zero-to-jupyterhub Helm values"
        ),
        "Dockerfile": dockerfile(dep),
        "Dockerfile.dockerignore": dockerignore(),
    }


def write_files(dep: GkeDeployment, out_dir: str | Path) -> list[Path]:
    """Render the deployment and write its files into ``out_dir`` (created if missing).

    Args:
        dep: a deployment from :func:`deployment`.
        out_dir: folder to write into; existing files of the same names are replaced.

    Returns:
        The paths written, in ``FILES`` order.

    Raises:
        GkeConfigError: ``out_dir`` exists but is not a folder, or one of the file names
            in it is taken by a folder; nothing is written then.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise GkeConfigError(f"--out {str(out)!r} exists and is not a folder; pick a folder.")
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise GkeConfigError(
            f"--out {str(out)!r} cannot be written ({str(existing)!r} is not a folder you "
            "can write); pick a folder you can write."
        )
    texts = render(dep)  # render fully before touching the disk
    blocked = [name for name in texts if (out / name).is_dir()]
    if blocked:
        raise GkeConfigError(
            f"Cannot write {', '.join(blocked)} into {str(out)!r}: a folder has that name. "
            "Pick another --out folder."
        )
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in texts.items():
        path = out / name
        path.write_text(text)
        written.append(path)
    return written


def summary(dep: GkeDeployment, written: list[Path]) -> str:
    """A short account of what was written and what the cluster needs.

    Args:
        dep: the deployment written.
        written: the paths :func:`write_files` returned.

    Returns:
        A few lines for the terminal.
    """
    shape = dep.shape
    if shape.single_host:
        pools = f"one node pool of {dep.slices} node(s)"
    else:
        pools = f"{dep.slices} node pool(s), one per slice, of {shape.hosts} nodes each"
    folder = written[0].parent if written else Path(".")
    return "\n".join([
        f"Wrote {', '.join(p.name for p in written)} to {folder}/",
        f"RayCluster {dep.name!r} (namespace {dep.namespace!r}, Ray {dep.ray_version}): "
        f"{dep.slices} slice(s) of {shape.label} ({shape.pod_type}), {shape.hosts} host(s) "
        f"x {shape.chips_per_host} chips each; worker group {dep.group_name!r}.",
        f"TPU capacity: {pools} with --tpu-topology {shape.topology}, on a "
        f"{shape.chips_per_host}-chip machine type whose nodes carry "
        f"cloud.google.com/gke-tpu-accelerator={shape.generation.gke_accelerator}.",
        f"Notebooks connect with RAY_ADDRESS={dep.ray_address}",
        f"Next: build and push {dep.image} from {folder / 'Dockerfile'}, "
        f"`kubectl apply -f {folder / 'raycluster.yaml'} -f "
        f"{folder / 'ray-networkpolicy.yaml'}`, then install the "
        f"jupyterhub chart with -f {folder / 'jupyterhub-values.yaml'}.",
    ])


def cmd_gke(args: argparse.Namespace) -> int:
    """``workbench gke``: check every setting, then write the files and a summary.

    Args:
        args: the parsed command line (see :func:`add_parser`).

    Returns:
        0 on success.

    Raises:
        CatalogError: the shape is not in the catalog; nothing is written.
        GkeConfigError: another setting or the output folder is not usable; nothing is
            written.
    """
    dep = deployment(
        args.generation, args.topology, slices=args.slices, image=args.image,
        namespace=args.namespace, name=args.name,
    )
    written = write_files(dep, args.out)
    print(summary(dep, written))
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``gke`` subcommand to the ``workbench`` command line.

    Args:
        subparsers: the object ``ArgumentParser.add_subparsers`` returned.

    Returns:
        The new subcommand's parser.
    """
    gke = subparsers.add_parser(
        "gke",
        help="write a KubeRay RayCluster, JupyterHub values and a Dockerfile for GKE",
        description="Render GKE deployment files for TPU slices of one catalog shape.",
    )
    gke.add_argument("--generation", required=True, help="TPU generation (v4, v5e, v5p, v6e, v7x)")
    gke.add_argument("--topology", required=True, help="slice topology, e.g. 4x4")
    gke.add_argument("--slices", type=int, default=1,
                     help=f"identical slices in the cluster, 1-{MAX_SLICES} (default 1)")
    gke.add_argument("--image", default=DEFAULT_IMAGE,
                     help="REGISTRY/PATH:TAG of the image built from the Dockerfile")
    gke.add_argument("--namespace", default=DEFAULT_NAMESPACE,
                     help=f"namespace of the RayCluster (default {DEFAULT_NAMESPACE})")
    gke.add_argument("--name", default=DEFAULT_NAME,
                     help=f"RayCluster name (default {DEFAULT_NAME})")
    gke.add_argument("--out", required=True, help="folder to write the files into")
    gke.set_defaults(func=cmd_gke)
    return gke
