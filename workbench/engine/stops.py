"""Runs in progress in this process, and what stops them when the process is asked to go.

- Interpreter exit (a kernel shut down, a CLI exiting) while a run trains in another
  thread: each run is asked to stop, so the learners write a final checkpoint, and given a
  few seconds before the process (and with it every actor it owns) goes.
- SIGTERM and SIGHUP (what Kubernetes sends a pod it evicts, drains or deletes, and what CI
  runners send on a timeout): the same, then every slice this process holds is released,
  and the process ends as the signal meant it to, well inside a pod's 30 s grace period.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator

log = logging.getLogger(__name__)

_active: set[threading.Event] = set()
_raise_in_main = False
"""Whether a termination signal ends in :class:`Terminated` (the CLI) rather than in the
signal's previous handler (a notebook kernel); set once, by whoever asks first."""
TERMINATION_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
STOP_GRACE_S = 20.0
"""How long a terminated process gives its runs to stop and checkpoint (a pod has 30 s)."""


class Terminated(BaseException):
    """The process got SIGTERM or SIGHUP; its runs have stopped and checkpointed."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


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


def handle_termination(*, raise_in_main: bool = False) -> bool:
    """Make SIGTERM and SIGHUP stop this process's runs cleanly before it goes.

    Called from the main thread (signals can only be handled there); elsewhere, or when the
    handlers are already in place, it does nothing. Called again after something else took
    the signals (``ray.init`` installs a handler of its own), it wraps that one.

    Args:
        raise_in_main: after the runs have stopped, raise :class:`Terminated` in the main
            thread (the CLI reports it and exits) instead of ending the process the way
            the signal's previous handler would (a notebook kernel). Once asked for, it
            holds for the process.

    Returns:
        Whether the handlers are in place.
    """
    global _raise_in_main
    if threading.current_thread() is not threading.main_thread():
        return False
    _raise_in_main = _raise_in_main or raise_in_main
    for signum in TERMINATION_SIGNALS:
        previous = signal.getsignal(signum)
        if getattr(previous, "workbench_stops", False):
            continue
        signal.signal(signum, _handler(previous))
    return True


def _handler(previous):
    def on_signal(signum, frame) -> None:
        log.warning("%s: stopping training (final checkpoint) and releasing slices",
                    signal.Signals(signum).name)
        stop_all(STOP_GRACE_S)
        _release_slices()
        if _raise_in_main:
            raise Terminated(signum)
        signal.signal(signum, previous)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            os.kill(os.getpid(), signum)

    on_signal.workbench_stops = True
    return on_signal


def _release_slices() -> None:
    from workbench.tpu.slice import release_all

    release_all()
