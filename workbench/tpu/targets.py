"""Compiling for a TPU slice on a machine without one: the compile-only devices that
libtpu describes for a catalog shape.

libtpu (the ``tpu`` extra: ``pip install 'tpu-rl-workbench[tpu]'``) carries the TPU
compiler and can describe any slice's devices without a chip attached
(``jax.experimental.topologies``). Programs lowered over those devices compile to what the
slice would run, so their memory per chip can be read before any slice is reserved.
Nothing here runs on a TPU, and nothing pretends: without libtpu the functions that need it
raise :class:`TpuCompilerMissingError`.

The topology names libtpu takes are ``<chip>:<topology>`` with its own chip names
(``v4``, ``v5e``, ``v5p``, ``v6e``, ``tpu7x``), plus how the chips split into hosts
(``chips_per_host_bounds``); v4 and v5p chips are asked for as one device per chip
(``chip_config_name="megacore"``, what JAX gives on them), v7x chips are two devices each.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from workbench.tpu.catalog import SliceShape

EXTRA = "pip install 'tpu-rl-workbench[tpu]'"
"""What installs libtpu for the pinned JAX."""

Layout = Literal["host", "chip"]
Bounds = tuple[int, int, int]

# libtpu's names of the chips, where they differ from the catalog's (it refuses "v7x").
_LIBTPU_CHIP = {"v7x": "tpu7x"}
# Chips with two TensorCores that JAX drives as one device ("megacore"); without the
# option libtpu's v4 topology lists every core as a device.
_MEGACORE = ("v4", "v5p")
# v7x chips show up as two devices each (one per die), however the chip is asked for.
_DEVICES_PER_CHIP = {"v7x": 2}


class TpuCompilerMissingError(ImportError):
    """libtpu, the TPU compiler, is not installed here."""

    def __init__(self, what: str = "Compiling for a TPU target") -> None:
        super().__init__(f"{what} needs libtpu, which is not installed: {EXTRA}.")


class TargetError(ValueError):
    """libtpu could not describe a catalog shape."""


@dataclass(frozen=True)
class TargetDevices:
    """The compile-only devices of one TPU slice, in the order a mesh takes them."""

    shape: SliceShape
    devices: tuple[Any, ...]
    """``jax.Device``-likes with no chip behind them: lower and compile over them, never run."""
    layout: Layout
    """How libtpu was told the chips split into processes: ``host`` (one per host) or
    ``chip`` (one per chip). The SPMD program over the devices is the same either way."""
    processes: int
    """The JAX processes those devices belong to."""
    topology_name: str
    """The name libtpu was asked for, e.g. ``v6e:2x2``."""

    @property
    def devices_per_chip(self) -> int:
        return devices_per_chip(self.shape)

    @property
    def hbm_bytes_per_device(self) -> int:
        """One device's share of its chip's HBM (the whole chip but on v7x)."""
        chip = int(self.shape.generation.hbm_gib_per_chip * 2**30)
        return chip // self.devices_per_chip


def libtpu_installed() -> bool:
    """Whether libtpu can be imported here (without importing it)."""
    if os.environ.get("TPU_LIBRARY_PATH"):
        return True  # JAX loads a libtpu.so named here before looking for the package
    return importlib.util.find_spec("libtpu") is not None


def devices_per_chip(shape: SliceShape) -> int:
    """JAX devices per chip of ``shape``: one, two on v7x."""
    return _DEVICES_PER_CHIP.get(shape.generation.name, 1)


def chips_per_process_bounds(shape: SliceShape, layout: Layout = "host") -> Bounds:
    """The chips of one JAX process along x, y and z.

    Args:
        shape: the slice's shape.
        layout: ``host`` (a process holds its host's chips: the board of a single-host
            slice, a 2x2x1 tray on a multi-host one) or ``chip`` (1x1x1).

    Returns:
        ``(x, y, z)``; the product is the chips of one process.

    Raises:
        TargetError: an unknown layout, or a shape with no known host board.
    """
    if layout == "chip":
        return (1, 1, 1)
    if layout != "host":
        raise TargetError(f"layout must be 'host' or 'chip', got {layout!r}.")
    if shape.generation.name in _DEVICES_PER_CHIP:
        # v7x hosts carry a 2x2x1 tray of four chips, the single-host 2x2x1 slice too.
        return (2, 2, 1)
    from workbench.tpu.process_env import ProcessLayoutError, host_chip_bounds

    try:
        return host_chip_bounds(shape)
    except ProcessLayoutError as error:
        raise TargetError(str(error)) from None


def topology_name(shape: SliceShape) -> str:
    """The name libtpu's compile-only topologies know ``shape`` by, e.g. ``v6e:4x4``,
    ``v4:2x2x2``, ``tpu7x:2x2x1``.

    A single host is named by its board (``host_chip_bounds``): the v5e-8 board, which GKE
    labels 2x4, lies 4x2.
    """
    gen = shape.generation
    dims = shape.topology
    if shape.single_host and gen.name not in _DEVICES_PER_CHIP:
        board = chips_per_process_bounds(shape, "host")
        dims = "x".join(str(d) for d in board[:gen.dims])
    return f"{_LIBTPU_CHIP.get(gen.name, gen.name)}:{dims}"


def _topology_options(shape: SliceShape, layout: Layout) -> dict[str, Any]:
    options: dict[str, Any] = {"chips_per_host_bounds": chips_per_process_bounds(shape, layout)}
    if shape.generation.name in _MEGACORE:
        options["chip_config_name"] = "megacore"
    return options


def compile_only_environment(shape: SliceShape) -> dict[str, str]:
    """The variables libtpu reads when it loads, for a process that only compiles for
    ``shape`` and never opens a chip (it runs JAX on the CPU); pure.

    NOTE: loading libtpu takes ``/tmp/libtpu_lockfile``, which keeps two processes off one
    host's chips; any JAX process that starts its backends with libtpu installed holds it,
    so a second process asking for a compile-only topology would fail. A process on the
    CPU opens no chip: for it the lock guards nothing. The others only quiet libtpu's
    start-up, which otherwise reports at length that this machine has no TPU: the metadata
    server is not asked, and the host is named as the target's own (what is compiled comes
    from the topology asked for, not from these; compiled sizes are the same without them).
    """
    # TPU_LOG_DIR: libtpu would otherwise log to /tmp/tpu_logs, which every Ray node on the
    # machine links into its logs and streams to every driver (ray/_private/node.py).
    return {"ALLOW_MULTIPLE_LIBTPU_LOAD": "true", "TPU_SKIP_MDS_QUERY": "1",
            "TPU_ACCELERATOR_TYPE": shape.pod_type, "TPU_WORKER_HOSTNAMES": "localhost",
            "TPU_LOG_DIR": "disabled"}


@contextlib.contextmanager
def _loading_libtpu(shape: SliceShape) -> Iterator[None]:
    """:func:`compile_only_environment` in ``os.environ`` while libtpu loads, in a process
    pinned to the CPU (one that may still open the TPU keeps libtpu's lock and defaults);
    afterwards the environment is as it was, so that nothing this process starts later
    inherits them (a learner compares its TPU variables with the slice's)."""
    import jax

    platforms = (jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS", "")).split(",")
    if platforms == [""] or "tpu" in platforms:
        yield
        return
    before = {k: os.environ.get(k) for k in compile_only_environment(shape)}
    for key, value in compile_only_environment(shape).items():
        os.environ.setdefault(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def target_devices(shape: SliceShape, layout: Layout = "host") -> TargetDevices:
    """The compile-only devices of ``shape``, as libtpu describes them.

    Args:
        shape: a catalog shape (:func:`workbench.tpu.catalog.parse_shape`).
        layout: how its chips split into JAX processes (see :class:`TargetDevices`).

    Returns:
        The devices and what they were made from; ``shape.chips * devices_per_chip(shape)``
        devices over ``shape.hosts`` processes (``shape.chips`` in the chip layout).

    Raises:
        TpuCompilerMissingError: libtpu is not installed.
        TargetError: libtpu refused the shape (its message is kept), or gave another
            number of devices than the catalog counts.
    """
    if not libtpu_installed():
        raise TpuCompilerMissingError(f"Compiling for {shape.label}")
    options = _topology_options(shape, layout)
    name = topology_name(shape)
    import jax
    from jax.experimental import topologies

    try:
        with _loading_libtpu(shape):
            described = topologies.get_topology_desc(platform="tpu", topology_name=name,
                                                     **options)
    except (RuntimeError, jax.errors.JaxRuntimeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        hint = ""
        if "lockfile" in first:
            hint = (" Another process holds libtpu's lock: set JAX_PLATFORMS=cpu in this "
                    "process (it only compiles) before JAX starts.")
        raise TargetError(f"libtpu cannot describe {shape.label} (asked for {name!r} with "
                          f"{options}): {first}{hint}") from None
    devices = tuple(described.devices)
    wanted = shape.chips * devices_per_chip(shape)
    if len(devices) != wanted:
        raise TargetError(f"libtpu describes {name!r} as {len(devices)} devices, but "
                          f"{shape.label} has {wanted}: not compiling for a slice that "
                          "is not the one asked for.")
    processes = len({d.process_index for d in devices})
    return TargetDevices(shape, devices, layout, processes, name)


__all__ = ["EXTRA", "TargetDevices", "TargetError", "TpuCompilerMissingError",
           "chips_per_process_bounds", "compile_only_environment", "devices_per_chip",
           "libtpu_installed", "target_devices", "topology_name"]
