"""The learner class each chip's process runs: the user's RLlib learner, bound to its chip's
torch device and device manager before anything is built."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from workbench.engine.rllib.backend import LearnerBackend


def chip_learner_class(learner_class: type, backend: LearnerBackend) -> type:
    """``learner_class`` whose process uses ``backend``'s device and device manager.

    Ray picks a worker's torch device manager from the accelerators it holds, so a learner
    holding a simulated chip's ``TPU`` would ask ``torch_tpu`` for its device (and fail at
    shutdown); RLlib's torch learner puts its module on the CPU unless it holds a GPU, so
    a learner on a real chip would leave the chip idle. Both are settled here, per process.
    """

    class ChipLearner(learner_class):
        def build(self) -> None:
            from ray.air._internal import device_manager

            # NOTE: the device manager is a per-process cache inside Ray (no public
            # setter); a learner process holds exactly one chip for its whole life.
            device_manager._torch_device_manager = (
                device_manager.get_torch_device_manager_by_device_type(backend.device))
            with _module_device(backend):
                super().build()

    ChipLearner.__name__ = ChipLearner.__qualname__ = f"Chip{learner_class.__name__}"
    return ChipLearner


@contextlib.contextmanager
def _module_device(backend: LearnerBackend) -> Iterator[None]:
    """While a learner builds, RLlib's torch learner asks for its device: the chip's."""
    if not backend.on_chip:
        yield  # RLlib's own choice, the CPU, is the simulated chip's device
        return
    from ray.air._internal.device_manager.tpu import TPUTorchDeviceManager
    from ray.rllib.core.learner.torch import torch_learner

    chip = TPUTorchDeviceManager().get_devices()[0]
    chosen = torch_learner.get_device
    torch_learner.get_device = lambda *args, **kwargs: chip
    try:
        yield
    finally:
        torch_learner.get_device = chosen
