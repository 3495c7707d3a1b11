"""GKE deployment files: every catalog shape renders a RayCluster that KubeRay's CRD schema
accepts and that carries the catalog's numbers; notebooks get an address `connect` takes;
bad input writes nothing; the checked-in examples under deploy/ are what the CLI renders."""

from __future__ import annotations

import math
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from workbench import cli
from workbench.tpu import gke
from workbench.tpu.catalog import CatalogError, all_shapes
from workbench.tpu.cluster import _split_address

REPO = Path(__file__).resolve().parent.parent
CRD = Path(__file__).resolve().parent / "data" / "kuberay" / "ray.io_rayclusters.yaml"
# The checked-in examples: folder under deploy/ -> the arguments that render it.
EXAMPLES = {
    "v6e-2x2": ["--generation", "v6e", "--topology", "2x2"],
    "v6e-4x4": ["--generation", "v6e", "--topology", "4x4"],
}
_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def _strict(node: object) -> object:
    """A Kubernetes structural schema node as a plain JSON schema, walked by keyword so
    that property names are never mistaken for keywords."""
    if not isinstance(node, dict):
        return node
    out: dict = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key == "properties":
            out[key] = {name: _strict(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = _strict(value)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [_strict(sub) for sub in value]
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if out.get("format") in _INT_RANGES:
        low, high = _INT_RANGES[out["format"]]
        out.setdefault("minimum", low)
        out.setdefault("maximum", high)
    if node.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    # The API server prunes unknown fields and `kubectl apply` (strict field validation by
    # default) refuses them: a misspelt field must fail here too.
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    # Not modelled: uniqueness of keys in x-kubernetes-list-type=map lists, and the CRD's
    # two CEL rules (immutability on update, and the managedBy values; we set no managedBy).
    return out


@pytest.fixture(scope="module")
def crd() -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with CRD.open() as f:
        return yaml.load(f, Loader=loader)


@pytest.fixture(scope="module")
def validator(crd) -> jsonschema.Draft7Validator:
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    assert version["served"] and version["storage"]
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def _errors(validator: jsonschema.Draft7Validator, manifest: dict) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(manifest)
    ]


def _pinned_ray() -> str:
    match = re.search(r'"ray(?:\[[^\]]*\])?==([^"]+)"', (REPO / "pyproject.toml").read_text())
    assert match, "pyproject.toml pins no exact ray version"
    return match.group(1)


def _worker_group(manifest: dict) -> dict:
    (group,) = manifest["spec"]["workerGroupSpecs"]
    return group


def test_every_catalog_shape_renders_a_valid_raycluster_with_the_catalog_numbers(
    crd, validator
):
    api_version = f"{crd['spec']['group']}/v1"
    shapes = all_shapes()
    assert len(shapes) > 100  # every generation, including the large 3D grids
    for shape in shapes:
        dep = gke.deployment(shape.generation.name, shape.topology, slices=3)
        manifest = gke.raycluster_manifest(dep)
        assert _errors(validator, manifest) == [], shape.label
        assert (manifest["apiVersion"], manifest["kind"]) == (api_version, "RayCluster")
        assert manifest["spec"]["rayVersion"] == _pinned_ray()

        group = _worker_group(manifest)
        assert group["numOfHosts"] == shape.hosts, shape.label
        assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 3
        pod = group["template"]["spec"]
        assert pod["nodeSelector"] == shape.gke_node_selector, shape.label
        (worker,) = pod["containers"]
        chips = worker["resources"]["limits"]["google.com/tpu"]
        assert chips == worker["resources"]["requests"]["google.com/tpu"]
        assert int(chips) == shape.chips_per_host, shape.label
        # The TPU webhook refuses a group whose numOfHosts is not the topology's chips over
        # the chips each pod asks for: check that rule from the manifest alone.
        topology = pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"]
        chip_count = math.prod(int(d) for d in topology.split("x"))
        assert max(chip_count // int(chips), 1) == group["numOfHosts"], shape.label
        # The webhook fills these in per pod and skips any the spec already sets.
        env_names = {e["name"] for e in worker.get("env", [])}
        assert not env_names & {"TPU_WORKER_ID", "TPU_NAME", "TPU_WORKER_HOSTNAMES"}
        ports = {p["containerPort"] for p in worker["ports"]}
        assert {8471, 8431, 8081} <= ports

        (head,) = manifest["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
        assert "google.com/tpu" not in head["resources"]["limits"]
        assert "nodeSelector" not in manifest["spec"]["headGroupSpec"]["template"]["spec"]


def test_written_manifest_is_the_rendered_one_for_every_generation(validator):
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for shape in {s.generation.name: s for s in all_shapes()}.values():  # largest of each
        dep = gke.deployment(shape.generation.name, shape.topology)
        manifest = yaml.load(gke.render(dep)["raycluster.yaml"], Loader=loader)
        assert manifest == gke.raycluster_manifest(dep), shape.label
        assert _errors(validator, manifest) == [], shape.label


@pytest.mark.parametrize(
    ("what", "path", "value"),
    [
        ("hosts as a string", ("numOfHosts",), "4"),
        ("a misspelt field", ("numOfHost",), 4),
        ("a TPU count that is no quantity", ("template", "spec", "containers", 0,
                                             "resources", "limits", "google.com/tpu"), "four"),
        ("replicas past int32", ("replicas",), 2**31),
        ("a node selector value that is a number", ("template", "spec", "nodeSelector",
                                                    "cloud.google.com/gke-tpu-topology"), 16),
    ],
)
def test_schema_refuses_a_broken_manifest(validator, what, path, value):
    manifest = gke.raycluster_manifest(gke.deployment("v6e", "4x4"))
    assert _errors(validator, manifest) == []
    node = _worker_group(manifest)
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert _errors(validator, manifest), f"{what} passed validation"


def test_notebooks_get_a_ray_address_that_connect_accepts():
    dep = gke.deployment("v6e", "2x2", namespace="team-a", name="rl")
    values = yaml.safe_load(gke.render(dep)["jupyterhub-values.yaml"])
    assert values == gke.jupyterhub_values(dep)
    single_user = values["singleuser"]
    address = single_user["extraEnv"]["RAY_ADDRESS"]
    assert address.startswith("ray://")  # notebooks are not Ray nodes: Ray Client
    host, port = _split_address(address)  # what workbench.connect() parses
    assert host == "rl-head-svc.team-a.svc.cluster.local"
    # The head pod serves that port under KubeRay's name for the Ray Client port.
    (head,) = gke.raycluster_manifest(dep)["spec"]["headGroupSpec"]["template"]["spec"][
        "containers"
    ]
    assert {p["name"]: p["containerPort"] for p in head["ports"]}["client"] == port
    # The single-user pods run the same image, and may reach exactly that port on the head.
    assert f"{single_user['image']['name']}:{single_user['image']['tag']}" == dep.image
    (rule,) = single_user["networkPolicy"]["egress"]
    (peer,) = rule["to"]
    assert peer["podSelector"]["matchLabels"] == {"ray.io/cluster": "rl",
                                                   "ray.io/node-type": "head"}
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "team-a"}
    assert rule["ports"] == [{"port": port, "protocol": "TCP"}]
    assert values["proxy"]["service"]["type"] == "ClusterIP"


def test_longest_allowed_name_keeps_every_webhook_hostname_a_dns_label():
    name = "a" * 43
    dep = gke.deployment("v5p", "16x16x24", slices=gke.MAX_SLICES, name=name)
    shape = dep.shape
    subdomain = f"{name}-headless-worker-svc"
    hostname = f"{dep.group_name}-{dep.slices - 1}-{shape.hosts - 1}"
    assert len(subdomain) <= 63 and len(hostname) <= 63
    with pytest.raises(gke.GkeConfigError, match="at most 43"):
        gke.deployment("v6e", "2x2", name="a" * 44)


def test_image_serves_head_tpu_hosts_and_notebooks_with_the_pinned_ray(tmp_path):
    dep = gke.deployment("v6e", "4x4")
    files = gke.render(dep)
    docker = files["Dockerfile"]
    manifest = gke.raycluster_manifest(dep)
    assert f'"ray[default]=={manifest["spec"]["rayVersion"]}"' in docker
    assert '"jax[tpu]"' in docker and "jupyterhub" in docker and "USER 1000" in docker
    images = {c["image"] for group in [manifest["spec"]["headGroupSpec"], _worker_group(manifest)]
              for c in group["template"]["spec"]["containers"]}
    assert images == {dep.image}
    ignored = files["Dockerfile.dockerignore"].splitlines()
    assert ".venv" in ignored and ".git" in ignored


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--generation", "v6e", "--topology", "5x5"], "Valid v6e topologies"),
        (["--generation", "v6e", "--topology", "2x2x2"], "v6e slices have 2D topologies"),
        (["--generation", "v9", "--topology", "2x2"], "Valid generations"),
        (["--generation", "v6e", "--topology", "2x2", "--slices", "0"], "from 1 to 64"),
        (["--generation", "v6e", "--topology", "2x2", "--slices", "-2"], "from 1 to 64"),
        (["--generation", "v6e", "--topology", "2x2", "--slices", "1000"], "from 1 to 64"),
        (["--generation", "v6e", "--topology", "2x2", "--name", "Workbench"], "DNS-1035"),
        (["--generation", "v6e", "--topology", "2x2", "--name", "1st"], "DNS-1035"),
        (["--generation", "v6e", "--topology", "2x2", "--name", "my_cluster"], "DNS-1035"),
        (["--generation", "v6e", "--topology", "2x2", "--namespace", "team-"], "DNS-1123"),
        (["--generation", "v6e", "--topology", "2x2", "--image", "workbench"], "tag is required"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    assert cli.main(["gke", *args, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("slices", [0, -1, 65, 2.0, "2", True, None])
def test_slices_must_be_a_whole_number_in_range(slices):
    with pytest.raises(gke.GkeConfigError, match=r"whole number from 1 to 64, got"):
        gke.deployment("v6e", "2x2", slices=slices)


def test_an_out_folder_that_cannot_be_written_is_refused(tmp_path, capsys):
    # Under a file: no user, root included, can create a folder there.
    blocker = tmp_path / "notes.txt"
    blocker.write_text("not a folder")
    assert cli.main(["gke", "--generation", "v6e", "--topology", "2x2", "--out",
                     str(blocker / "deploy")]) == 2
    assert "cannot be written" in capsys.readouterr().err
    assert blocker.read_text() == "not a folder"


def test_out_path_that_is_a_file_is_refused(tmp_path, capsys):
    target = tmp_path / "taken"
    target.write_text("keep me")
    assert cli.main(["gke", "--generation", "v6e", "--topology", "2x2",
                     "--out", str(target)]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert target.read_text() == "keep me"


def test_cli_writes_the_files_and_says_what_it_wrote(tmp_path, capsys):
    out = tmp_path / "deploy" / "v5e"
    args = ["gke", "--generation", "v5litepod", "--topology", "4x4", "--slices", "2",
            "--image", "registry.example.com:5000/rl/wb:abc123", "--namespace", "rl",
            "--name", "shared", "--out", str(out)]
    assert cli.main(args) == 0
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == sorted(gke.FILES)
    assert "RAY_ADDRESS=ray://shared-head-svc.rl.svc.cluster.local:10001" in printed
    assert "2 node pool(s), one per slice, of 4 nodes each" in printed
    manifest = yaml.safe_load((out / "raycluster.yaml").read_text())
    group = _worker_group(manifest)
    assert (manifest["metadata"]["name"], manifest["metadata"]["namespace"]) == ("shared", "rl")
    assert (group["groupName"], group["replicas"], group["numOfHosts"]) == ("v5e-4x4", 2, 4)
    assert group["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == (
        "tpu-v5-lite-podslice"
    )
    first = {name: (out / name).read_text() for name in gke.FILES}
    assert cli.main(args) == 0  # running again rewrites the same files
    assert {name: (out / name).read_text() for name in gke.FILES} == first


@pytest.mark.parametrize("folder", sorted(EXAMPLES))
def test_deploy_examples_match_what_the_cli_renders(tmp_path, capsys, folder):
    args = EXAMPLES[folder]
    regenerate = f"workbench gke {' '.join(args)} --out deploy/{folder}"
    checked_in = REPO / "deploy" / folder
    assert cli.main(["gke", *args, "--out", str(tmp_path)]) == 0
    for name in gke.FILES:
        path = checked_in / name
        assert path.is_file(), f"deploy/{folder}/{name} is missing; run: {regenerate}"
        assert path.read_text() == (tmp_path / name).read_text(), (
            f"deploy/{folder}/{name} differs from what the CLI renders; run: {regenerate}"
        )


def test_catalog_errors_are_the_catalogs_own():
    with pytest.raises(CatalogError, match="Valid v4 topologies"):
        gke.deployment("v4", "4x4")


def test_every_ray_pod_runs_with_least_privilege_and_a_grace_period_to_checkpoint():
    dep = gke.deployment("v6e", "4x4")
    spec = gke.raycluster_manifest(dep)["spec"]
    templates = [spec["headGroupSpec"]["template"]] + \
        [group["template"] for group in spec["workerGroupSpecs"]]
    for template in templates:
        pod = template["spec"]
        assert pod["terminationGracePeriodSeconds"] >= 30
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"] == {"drop": ["ALL"]}
            assert not security.get("privileged")
    # The single-user pods get the same grace period.
    values = gke.jupyterhub_values(dep)
    assert values["singleuser"]["extraPodConfig"]["terminationGracePeriodSeconds"] >= 30


def test_tpu_workers_get_the_environment_of_kuberays_tpu_samples():
    spec = gke.raycluster_manifest(gke.deployment("v6e", "2x2"))["spec"]
    env = {e["name"]: e for e in spec["workerGroupSpecs"][0]["template"]["spec"]
           ["containers"][0]["env"]}
    assert env["NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert env["VBAR_CONTROL_SERVICE_URL"]["value"] == "$(NODE_IP):8353"
    assert env["JAX_PLATFORMS"]["value"] == "tpu,cpu"
    assert env["ENABLE_PJRT_COMPATIBILITY"]["value"] == "true"
    # What the webhook and the device plugin set is left to them.
    assert not set(env) & {"TPU_NAME", "TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES",
                           "TPU_ACCELERATOR_TYPE", "TPU_TOPOLOGY"}


def test_the_ray_pods_admit_only_their_own_pods_and_the_notebooks_client_port():
    dep = gke.deployment("v6e", "2x2", name="wb", namespace="team")
    policy = gke.network_policy(dep)
    assert policy["kind"] == "NetworkPolicy" and policy["metadata"]["namespace"] == "team"
    assert policy["spec"]["podSelector"] == {"matchLabels": {"ray.io/cluster": "wb"}}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    own, notebooks = policy["spec"]["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": {"ray.io/cluster": "wb"}}}]}
    assert notebooks["ports"] == [{"port": 10001, "protocol": "TCP"}]
    assert notebooks["from"][0]["podSelector"]["matchLabels"] == \
        {"component": "singleuser-server"}
    assert yaml.safe_load(gke.render(dep)["ray-networkpolicy.yaml"]) == policy


def test_an_image_may_be_pinned_by_digest():
    digest = "sha256:" + "ab" * 32
    image = f"us-docker.pkg.dev/p/workbench/tpu-rl-workbench:0.1.0@{digest}"
    dep = gke.deployment("v6e", "2x2", image=image)
    spec = gke.raycluster_manifest(dep)["spec"]
    assert spec["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == image
    values = gke.jupyterhub_values(dep)["singleuser"]["image"]
    assert f"{values['name']}:{values['tag']}" == image
    for bad in (f"us-docker.pkg.dev/p/w@{digest}", f"w:1@sha256:{'ab' * 10}"):
        with pytest.raises(gke.GkeConfigError, match="pinned by digest"):
            gke.deployment("v6e", "2x2", image=bad)
