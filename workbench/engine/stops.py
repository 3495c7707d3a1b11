"""Runs in progress in this process, so that the process ending stops them cleanly.

A kernel shut down (or a CLI exiting) while a run trains in another thread: each run is
asked to stop, so the learners write a final checkpoint, and given a few seconds before
the process (and with it every actor it owns) goes.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from collections.abc import Iterator

_active: set[threading.Event] = set()


def stop_all(grace_s: float = 4.0) -> None:
    """Ask every run in progress to stop, and wait up to ``grace_s`` for them to end."""
    events = list(_active)
    for event in events:
        event.set()
    deadline = time.monotonic() + grace_s
    while any(event in _active for event in events) and time.monotonic() < deadline:
        time.sleep(0.05)


@contextlib.contextmanager
def registered(event: threading.Event) -> Iterator[None]:
    """Count the run whose stop flag is ``event`` as in progress for the block."""
    _active.add(event)
    # NOTE: exit handlers run last-registered first: this one must run before Ray's own
    # (added by ray.init, earlier), which would take the actors away before they could
    # checkpoint; so it is registered again, last, each time a run starts.
    atexit.unregister(stop_all)
    atexit.register(stop_all)
    try:
        yield
    finally:
        _active.discard(event)
