"""What both engines do when a learner of the slice is lost: give the slice back and hold
an intact one of the same shape in its place, a bounded number of times."""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)


class ChipLost(RuntimeError):
    """A learner of the slice died (killed, or its host was lost)."""


def hold_intact_slice(tpu_slice, lost: ChipLost, restarts: int, max_restarts: int,
                      timeout_s: float, limit: str = "max_restarts") -> float:
    """After ``lost``, give ``tpu_slice`` back and hold an intact slice of the same shape
    in the same handle, for restart number ``restarts + 1``; returns the seconds it took.
    What ran on the slice must be stopped first.

    Raises:
        ChipLost: ``restarts`` has reached ``max_restarts`` (called ``limit`` in the message).
        SliceUnavailableError: no intact slice within ``timeout_s``.
    """
    if restarts >= max_restarts:
        raise ChipLost(
            f"{lost} (after {restarts} restart(s), the most {limit} allows). Check the "
            "cluster's hosts with wb.list_slices()."
        ) from lost
    log.warning("%s; restarting on an intact slice from the last checkpoint", lost)
    started = time.monotonic()
    tpu_slice.recover(timeout_s=timeout_s)
    return time.monotonic() - started
