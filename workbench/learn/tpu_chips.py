"""Which TPU chips a host has, read from its PCI devices as JAX and libtpu read them.

A TPU chip is a PCI device with Google's vendor id and one of the TPU device ids. The
vendor id alone is not enough: Google's virtual NIC (gVNIC) and NVMe disks carry it too,
so every Compute Engine VM, TPU or not, has such devices. Device nodes are no better a
sign: ``/dev/vfio`` exists on any machine that passes a device through VFIO.
"""

from __future__ import annotations

import glob
import os

GOOGLE_PCI_VENDOR_ID = "0x1ae0"

TPU_PCI_DEVICE_IDS: dict[str, str] = {
    "0x0027": "v3",
    "0x0056": "plc",
    "0x005e": "v4",
    "0x0062": "v5p",
    "0x0063": "v5e",
    "0x006f": "v6e",
    "0x0076": "tpu7x",
    "0x007c": "tpu8t",
    "0x0083": "tpu8i",
}
"""PCI device ids of Google's TPU chips, by generation (the same table JAX keeps). A chip
newer than this table is not seen; ``JAX_PLATFORMS=tpu`` still selects it."""


def _read_id(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip().lower()
    except (OSError, UnicodeDecodeError):
        # A device that went away between the listing and the read, or an unreadable
        # sysfs (a sandbox): that device does not count.
        return None


def tpu_chip_generations(sysfs_root: str = "/sys") -> list[str]:
    """The generation of each TPU chip attached to this host through PCI, one per chip.

    Args:
        sysfs_root: where sysfs is mounted; a test points it at a fake tree holding
            ``bus/pci/devices/<address>/{vendor,device}`` files.

    Returns:
        One entry of :data:`TPU_PCI_DEVICE_IDS`'s values per chip, in PCI address order;
        empty on a host without TPU chips or without sysfs (not Linux).
    """
    generations = []
    pattern = os.path.join(sysfs_root, "bus", "pci", "devices", "*", "vendor")
    for vendor_path in sorted(glob.glob(pattern)):
        if _read_id(vendor_path) != GOOGLE_PCI_VENDOR_ID:
            continue
        device_id = _read_id(os.path.join(os.path.dirname(vendor_path), "device"))
        if device_id in TPU_PCI_DEVICE_IDS:
            generations.append(TPU_PCI_DEVICE_IDS[device_id])
    return generations


def has_tpu_chips(sysfs_root: str = "/sys") -> bool:
    """Whether this host has at least one TPU chip on its PCI bus (see
    :func:`tpu_chip_generations`)."""
    return bool(tpu_chip_generations(sysfs_root))
