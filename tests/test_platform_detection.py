"""A learner's platform comes from the host's PCI devices, as JAX and libtpu find TPU chips:
fake sysfs trees stand in for a TPU host, a Compute Engine VM without TPUs, and a machine
that passes devices through VFIO."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.learn.platform import current_platform
from workbench.learn.tpu_chips import has_tpu_chips, tpu_chip_generations


def _pci_device(sysfs: Path, address: str, vendor: str, device: str) -> None:
    folder = sysfs / "bus" / "pci" / "devices" / address
    folder.mkdir(parents=True)
    (folder / "vendor").write_text(f"{vendor}\n")
    (folder / "device").write_text(f"{device}\n")


@pytest.fixture(autouse=True)
def no_configured_platform(monkeypatch):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)


def test_a_host_with_tpu_chips_on_its_pci_bus_is_tpu(tmp_path):
    _pci_device(tmp_path, "0000:00:04.0", "0x1ae0", "0x0042")  # gVNIC
    for slot in range(4):
        _pci_device(tmp_path, f"0000:00:0{slot + 5}.0", "0x1ae0", "0x0063")
    assert tpu_chip_generations(str(tmp_path)) == ["v5e"] * 4
    assert current_platform(sysfs_root=str(tmp_path)) == "tpu"


def test_other_devices_and_googles_non_tpu_devices_are_cpu(tmp_path):
    # A Compute Engine VM: Google's NIC and disk carry Google's vendor id but are not chips.
    _pci_device(tmp_path, "0000:00:04.0", "0x1ae0", "0x0042")
    _pci_device(tmp_path, "0000:00:05.0", "0x1ae0", "0x001f")
    _pci_device(tmp_path, "0000:00:06.0", "0x10de", "0x2330")
    _pci_device(tmp_path, "0000:00:07.0", "0x8086", "0x1237")
    assert not has_tpu_chips(str(tmp_path))
    assert current_platform(sysfs_root=str(tmp_path)) == "cpu"


def test_a_vfio_folder_or_no_sysfs_at_all_is_cpu(tmp_path):
    (tmp_path / "dev" / "vfio").mkdir(parents=True)
    (tmp_path / "dev" / "vfio" / "vfio").touch()
    _pci_device(tmp_path, "0000:00:06.0", "0x10de", "0x2330")
    assert current_platform(sysfs_root=str(tmp_path)) == "cpu"
    assert current_platform(sysfs_root=str(tmp_path / "missing")) == "cpu"


def test_an_unreadable_device_does_not_count(tmp_path):
    _pci_device(tmp_path, "0000:00:05.0", "0x1ae0", "0x006f")
    (tmp_path / "bus" / "pci" / "devices" / "0000:00:05.0" / "device").unlink()
    assert current_platform(sysfs_root=str(tmp_path)) == "cpu"


def test_the_hosts_jax_platforms_wins(tmp_path, monkeypatch):
    _pci_device(tmp_path, "0000:00:05.0", "0x1ae0", "0x005e")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu,tpu")
    assert current_platform(sysfs_root=str(tmp_path)) == "cpu"
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    assert current_platform(sysfs_root=str(tmp_path / "missing")) == "tpu"
