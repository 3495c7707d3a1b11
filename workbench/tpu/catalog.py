"""The TPU catalog: generations, valid topologies, hosts and chips, and GKE values.

Pure data and pure functions; nothing here talks to Ray. Every user-facing string
(a generation or a topology typed into a widget, a CLI flag, a notebook parameter)
is parsed here with a regular expression and table look-ups, never evaluated.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache


class CatalogError(ValueError):
    """A generation or topology that the catalog does not know."""


@dataclass(frozen=True)
class Generation:
    """One TPU generation and the facts that do not depend on the slice shape."""

    name: str
    """Canonical short name used throughout the workbench (``v6e``)."""
    ray_version: str
    """The accelerator version Ray's TPU helpers expect (``v5litepod`` for v5e)."""
    cores_per_chip: int
    """TensorCores per chip; Ray and GCP count pod-type sizes in cores for 2-core chips."""
    hbm_gib_per_chip: float
    """High-bandwidth memory per chip, GiB."""
    peak_bf16_tflops_per_chip: float
    """Peak dense bf16 TFLOP/s per chip from the public spec sheet."""
    gke_accelerator: str
    """Value of the ``cloud.google.com/gke-tpu-accelerator`` node label."""
    max_chips_single_host: int
    """Largest slice that one host (VM) carries whole."""
    dims: int
    """2 for the 2D-torus generations, 3 for the 3D ones."""
    hbm_gbps_per_chip: float
    """HBM bandwidth per chip, GB/s (10^9 bytes per second)."""


# Per-chip figures from Google Cloud's public TPU system-architecture pages
# (cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e, /tpu7x), read 2026-12.
# v7x (Ironwood) is listed at 4,614 dense FP8 TFLOP/s; bf16 is half of that.
# HBM bandwidth per chip, from the same pages' tables: v4 "HBM2 capacity and bandwidth
# 32 GiB, 1200 GBps", v5e "16 GB, 819 GBps", v5p "HBM2e 95 GB, 2765 GBps", v6e "HBM
# bandwidth per chip 1638 GBps" (1,640 in earlier versions of the page); v7x 7,370 GB/s
# from the TPU7x page's comparison table (not re-read here).
GENERATIONS: dict[str, Generation] = {
    g.name: g
    for g in (
        Generation("v4", "v4", 2, 32.0, 275.0, "tpu-v4-podslice", 4, 3, 1200.0),
        Generation("v5e", "v5litepod", 1, 16.0, 197.0, "tpu-v5-lite-podslice", 8, 2, 819.0),
        Generation("v5p", "v5p", 2, 95.0, 459.0, "tpu-v5p-slice", 4, 3, 2765.0),
        Generation("v6e", "v6e", 1, 32.0, 918.0, "tpu-v6e-slice", 8, 2, 1638.0),
        Generation("v7x", "v7x", 2, 192.0, 2307.0, "tpu7x", 4, 3, 7370.0),
    )
}

_ALIASES = {
    "v5litepod": "v5e",
    "v5lite": "v5e",
    "v5lite-podslice": "v5e",
    "v5-lite-podslice": "v5e",
    "7x": "v7x",
    "v4-podslice": "v4",
    "v5p-slice": "v5p",
    "v6e-slice": "v6e",
}

# Chips on one host for multi-host slices of every generation.
CHIPS_PER_MULTI_HOST = 4
# The shapes that v5e/v6e place on a single host (up to 8 chips on one VM).
_SINGLE_HOST_2D = ("1x1", "2x2", "2x4")
_TOPOLOGY_RE = re.compile(r"^([1-9][0-9]{0,2})x([1-9][0-9]{0,2})(?:x([1-9][0-9]{0,2}))?$")


def _grid_3d(small: tuple[str, ...], max_x: int, max_y: int, max_z: int) -> tuple[str, ...]:
    # Past the small shapes, 3D slices grow in steps of 4 chips along every axis.
    big = [
        f"{x}x{y}x{z}"
        for x in range(4, max_x + 1, 4)
        for y in range(4, max_y + 1, 4)
        for z in range(4, max_z + 1, 4)
    ]
    return small + tuple(big)


_SMALL_3D = ("2x2x1", "2x2x2", "2x2x4", "2x4x4")
_2D = ("1x1", "2x2", "2x4", "2x8", "4x4", "4x8", "8x8", "8x16", "16x16")

_TOPOLOGIES: dict[str, tuple[str, ...]] = {
    "v4": _grid_3d(_SMALL_3D, 12, 12, 16),
    "v5e": _2D,
    "v5p": _grid_3d(_SMALL_3D, 16, 16, 24),
    "v6e": _2D,
    "v7x": _SMALL_3D + ("4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16"),
}


@dataclass(frozen=True)
class SliceShape:
    """A generation and a topology: everything derivable about one TPU slice."""

    generation: Generation
    topology: str

    @property
    def chips(self) -> int:
        return math.prod(int(d) for d in self.topology.split("x"))

    @property
    def chips_per_host(self) -> int:
        single_host = self.generation.max_chips_single_host
        if single_host > CHIPS_PER_MULTI_HOST and self.topology in _SINGLE_HOST_2D:
            return self.chips
        return min(self.chips, CHIPS_PER_MULTI_HOST)

    @property
    def hosts(self) -> int:
        return max(1, self.chips // self.chips_per_host)

    @property
    def single_host(self) -> bool:
        return self.hosts == 1

    @property
    def cores(self) -> int:
        return self.chips * self.generation.cores_per_chip

    @property
    def pod_type(self) -> str:
        """GCP's name for the shape, e.g. ``v6e-16``; sized in cores for 2-core chips."""
        return f"{self.generation.ray_version}-{self.cores}"

    @property
    def hbm_gib(self) -> float:
        return self.chips * self.generation.hbm_gib_per_chip

    @property
    def peak_bf16_tflops(self) -> float:
        return self.chips * self.generation.peak_bf16_tflops_per_chip

    @property
    def gke_node_selector(self) -> dict[str, str]:
        return {
            "cloud.google.com/gke-tpu-accelerator": self.generation.gke_accelerator,
            "cloud.google.com/gke-tpu-topology": self.topology,
        }

    @property
    def label(self) -> str:
        return f"{self.generation.name} {self.topology}"

    def describe(self) -> dict[str, object]:
        """Every catalog fact about the shape as plain JSON-ready values."""
        return {
            "generation": self.generation.name,
            "topology": self.topology,
            "pod_type": self.pod_type,
            "chips": self.chips,
            "hosts": self.hosts,
            "chips_per_host": self.chips_per_host,
            "hbm_gib_per_chip": self.generation.hbm_gib_per_chip,
            "hbm_gib_total": self.hbm_gib,
            "peak_bf16_tflops_per_chip": self.generation.peak_bf16_tflops_per_chip,
            "peak_bf16_tflops_total": self.peak_bf16_tflops,
            "hbm_gbps_per_chip": self.generation.hbm_gbps_per_chip,
            "gke_node_selector": self.gke_node_selector,
        }


def generation_names() -> tuple[str, ...]:
    return tuple(GENERATIONS)


def _shown(value: object, limit: int = 40) -> str:
    """``repr`` of a user's input for an error message, cut short so that a pasted blob
    cannot bury the part of the message that says what to do."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def parse_generation(value: object) -> Generation:
    """Return the generation a user meant, accepting common spellings.

    Accepts ``v6e``, ``V6E``, ``tpu-v6e``, ``TPU-V4``, ``v5litepod`` (v5e), ``tpu7x``.

    Raises:
        CatalogError: for anything else, listing the valid generations.
    """
    valid = ", ".join(GENERATIONS)
    if not isinstance(value, str):
        raise CatalogError(
            f"TPU generation must be a string such as 'v6e', got {_shown(value)} "
            f"({type(value).__name__}). Valid generations: {valid}."
        )
    key = value.strip().lower()
    if re.fullmatch(r"tpu[-_ ]?v?[0-9].*", key):
        key = re.sub(r"^tpu[-_ ]?v?", "v", key)
    key = _ALIASES.get(key, key)
    if key not in GENERATIONS:
        raise CatalogError(
            f"Unknown TPU generation {_shown(value)}. Valid generations: {valid} "
            "(aliases such as 'TPU-V6E', 'tpu-v4' and 'v5litepod' are accepted)."
        )
    return GENERATIONS[key]


def topologies(generation: object) -> tuple[str, ...]:
    """The valid topologies of a generation, smallest first."""
    gen = parse_generation(generation)
    return tuple(sorted(_TOPOLOGIES[gen.name], key=_topology_sort_key))


def _topology_sort_key(topology: str) -> tuple[int, tuple[int, ...]]:
    dims = tuple(int(d) for d in topology.split("x"))
    return math.prod(dims), dims


def _topology_hint(gen: Generation) -> str:
    valid = topologies(gen.name)
    shown = ", ".join(valid[:12])
    more = f" and {len(valid) - 12} larger" if len(valid) > 12 else ""
    return (
        f"Valid {gen.name} topologies: {shown}{more} "
        f"(`workbench topologies --generation {gen.name}` lists them all)."
    )


def parse_shape(generation: object, topology: object) -> SliceShape:
    """Validate a generation and topology together and return the slice shape.

    Raises:
        CatalogError: naming what was asked, what is valid, and what to do.
    """
    gen = parse_generation(generation)
    if not isinstance(topology, str):
        raise CatalogError(
            f"Topology must be a string such as '2x2' or '2x2x1', got {_shown(topology)} "
            f"({type(topology).__name__}). {_topology_hint(gen)}"
        )
    key = topology.strip().lower()
    match = _TOPOLOGY_RE.fullmatch(key)
    if match is None:
        raise CatalogError(
            f"Topology {_shown(topology)} is not of the form AxB or AxBxC (whole numbers "
            f"from 1 to 999). {_topology_hint(gen)}"
        )
    if key not in _TOPOLOGIES[gen.name]:
        dims = 3 if match.group(3) else 2
        owners = [g for g, valid in _TOPOLOGIES.items() if key in valid]
        why = (
            f"{gen.name} slices have {gen.dims}D topologies, but {topology!r} is {dims}D."
            if dims != gen.dims
            else f"Topology {topology!r} is not a valid {gen.name} slice."
        )
        elsewhere = f" It exists on {', '.join(owners)}." if owners else ""
        raise CatalogError(f"{why}{elsewhere} {_topology_hint(gen)}")
    return SliceShape(gen, key)


@cache
def all_shapes() -> tuple[SliceShape, ...]:
    """Every shape in the catalog, by generation then size."""
    return tuple(SliceShape(GENERATIONS[g], t) for g in GENERATIONS for t in topologies(g))


def shape_from_pod_type(pod_type: str, topology: str) -> SliceShape | None:
    """The catalog shape a Ray node's ``ray.io/tpu-pod-type`` and topology labels describe."""
    version = pod_type.rsplit("-", 1)[0]
    for gen in GENERATIONS.values():
        if gen.ray_version == version:
            try:
                shape = parse_shape(gen.name, topology)
            except CatalogError:
                return None
            return shape if shape.pod_type == pod_type else None
    return None
