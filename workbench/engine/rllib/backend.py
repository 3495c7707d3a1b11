"""Which torch device and collective an RLlib learner uses on a chip (pure).

On a TPU host a learner's torch device is the chip, through Ray's TPU torch device manager
(``torch_tpu``, device ``"tpu"``), and its data-parallel group is joined with the
``tpu_dist`` collective; Ray Train picks both by itself for a worker that holds a ``TPU``
resource. The simulated slice's hosts are CPU machines that carry the same ``TPU``
resource, so there the learners must be told otherwise: torch on the CPU, joined with gloo.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LearnerBackend:
    """How one chip's RLlib learner computes and talks to the others."""

    platform: str
    """The host's platform as a chip's process sees it (``tpu`` or ``cpu``)."""
    collective: str
    """The ``torch.distributed`` backend of the learners' group."""
    device: str
    """The torch device each learner's module and batches live on."""
    device_manager: str
    """The Ray device manager that hands out that device."""

    @property
    def on_chip(self) -> bool:
        return self.device == "tpu"


def learner_backend(platform: str) -> LearnerBackend:
    """The learner backend for a host of ``platform`` (``tpu`` or ``cpu``).

    Raises:
        ValueError: a platform the workbench does not place RLlib learners on.
    """
    if platform == "tpu":
        return LearnerBackend(platform, collective="tpu_dist", device="tpu",
                              device_manager="TPUTorchDeviceManager")
    if platform == "cpu":
        return LearnerBackend(platform, collective="gloo", device="cpu",
                              device_manager="CPUTorchDeviceManager")
    raise ValueError(f"RLlib learners run on 'tpu' hosts or on the simulated slice's 'cpu' "
                     f"hosts; this slice's hosts report {platform!r}.")
