"""The catalog against Ray's own TPU tables, and how it refuses bad input."""

from __future__ import annotations

import pytest
from ray._private.accelerators.tpu import (
    VALID_TPU_TOPOLOGY,
    get_chips_per_host,
    infer_tpu_pod_type_from_topology,
)

from workbench.tpu.catalog import (
    GENERATIONS,
    CatalogError,
    parse_generation,
    parse_shape,
    topologies,
)


def test_the_catalog_has_every_generation_users_pick_from():
    # The tests below run once per generation: an empty catalog would run none of them.
    assert list(GENERATIONS) == ["v4", "v5e", "v5p", "v6e", "v7x"]


@pytest.mark.parametrize("generation", list(GENERATIONS))
def test_every_catalog_topology_is_valid_for_ray(generation):
    gen = GENERATIONS[generation]
    catalog = topologies(generation)
    # As many as Ray's table, each once and each in it (below): the same topologies.
    assert len(set(catalog)) == len(catalog) == len(VALID_TPU_TOPOLOGY[gen.ray_version]) > 0
    for topology in catalog:
        assert topology in VALID_TPU_TOPOLOGY[gen.ray_version], (generation, topology)


@pytest.mark.parametrize("generation", list(GENERATIONS))
def test_every_ray_topology_is_in_the_catalog(generation):
    gen = GENERATIONS[generation]
    assert len(VALID_TPU_TOPOLOGY[gen.ray_version]) > 0, gen.ray_version
    for topology in VALID_TPU_TOPOLOGY[gen.ray_version]:
        assert parse_shape(generation, topology).topology == topology


@pytest.mark.parametrize("generation", list(GENERATIONS))
def test_hosts_and_pod_types_agree_with_ray(generation):
    gen = GENERATIONS[generation]
    assert len(topologies(generation)) == len(VALID_TPU_TOPOLOGY[gen.ray_version]) > 0
    for topology in topologies(generation):
        shape = parse_shape(generation, topology)
        assert shape.chips_per_host == get_chips_per_host(topology, gen.ray_version)
        assert shape.pod_type == infer_tpu_pod_type_from_topology(topology, gen.ray_version)
        assert shape.hosts * shape.chips_per_host == shape.chips


def test_shapes_users_rely_on():
    big = parse_shape("v6e", "4x4")
    assert (big.chips, big.hosts, big.chips_per_host, big.pod_type) == (16, 4, 4, "v6e-16")
    one_host = parse_shape("v6e", "2x4")
    assert (one_host.chips, one_host.hosts, one_host.chips_per_host) == (8, 1, 8)
    v4 = parse_shape("v4", "2x2x2")
    assert (v4.chips, v4.hosts, v4.pod_type) == (8, 2, "v4-16")
    v5e = parse_shape("v5e", "2x2")
    assert v5e.pod_type == "v5litepod-4"
    assert v5e.gke_node_selector == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "2x2",
    }
    assert big.hbm_gib == 16 * 32 and big.peak_bf16_tflops == 16 * 918


@pytest.mark.parametrize(
    "alias, canonical",
    [("v6e", "v6e"), ("V6E", "v6e"), ("tpu-v6e", "v6e"), ("TPU-V4", "v4"), (" v5p ", "v5p"),
     ("v5litepod", "v5e"), ("V5LITEPOD", "v5e"), ("tpu7x", "v7x"), ("TPU-V7X", "v7x")],
)
def test_aliases(alias, canonical):
    assert parse_generation(alias).name == canonical


BAD_SHAPES = [
    ("v6e", "4x"), ("v6e", "0x4"), ("v6e", "4x4x4x4"), ("v6e", "-2x2"), ("v6e", "999x999"),
    ("v6e", None), ("v6e", 4), ("v9", "2x2"), ("v6e", "4x4; rm -rf /"), ("v4", "4x4"),
    ("v6e", "2x2x1"), ("v6e", ""), ("v6e", "x"), ("v6e", "2*2"), ("v6e", "3x3"),
    ("v6e", "__import__('os')"), ("v6e", "2x2\x00"), (None, "2x2"), (6, "2x2"), ("", "2x2"),
    ("v6e", "4X4X"), ("v5p", "3x3x3"), ("v7x", "16x16x16"), ("v6e", "1e3x2"), ("v6e", b"2x2"),
    ("gpu", "2x2"), ("v6e", "２x２"),
]


@pytest.mark.parametrize("generation, topology", BAD_SHAPES)
def test_bad_shapes_are_refused_with_the_valid_choices(generation, topology):
    with pytest.raises(CatalogError) as info:
        parse_shape(generation, topology)
    message = str(info.value)
    assert "Valid" in message
    if isinstance(generation, str) and generation.strip().lower() in GENERATIONS:
        # The refusal names the valid topologies of the generation that was asked for.
        assert topologies(generation)[0] in message


def test_a_shape_from_another_generation_says_where_it_exists():
    with pytest.raises(CatalogError, match="exists on v5e, v6e"):
        parse_shape("v4", "4x4")


def test_topology_whitespace_and_case_are_forgiven():
    assert parse_shape("v6e", " 4X4 ").topology == "4x4"
