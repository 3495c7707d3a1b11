"""Work going on in a background thread: callbacks, a stop flag, a result, an
interruptible wait. The run handles of both engines (:mod:`workbench.engine.run`,
:mod:`workbench.engine.rllib.run`) are this with their own work."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

UpdateCallback = Callable[..., None]
EndCallback = Callable[["BackgroundRun"], None]


class BackgroundRun:
    """Work going on in a background thread, with callbacks, a stop flag and a result.

    Subclasses plan in ``__init__`` (so a bad config fails in the caller's cell) and do the
    work in :meth:`_work`, calling :meth:`_on_row` with each update's news and polling
    :attr:`stopped`.
    """

    def __init__(self, tpu_slice, *, release_slice: bool = False) -> None:
        self.tpu_slice = tpu_slice
        self.release_slice = release_slice
        self.result: Any = None
        self.error: BaseException | None = None
        self._rows: list = []
        self._update_callbacks: list[UpdateCallback] = []
        self._stop_callbacks: list[Callable[[], None]] = []
        self._end_callbacks: list[EndCallback] = []
        self._stop = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="workbench-run", daemon=True)

    # ---- observing --------------------------------------------------------------------

    def on_update(self, callback: UpdateCallback):
        """Call ``callback(...)`` (from the work's thread) with each update's news."""
        self._update_callbacks.append(callback)
        return self

    def on_stop(self, callback: Callable[[], None]):
        """Call ``callback()`` when a stop is asked for (from whichever thread asked)."""
        self._stop_callbacks.append(callback)
        return self

    def on_end(self, callback: EndCallback):
        """Call ``callback(run)`` (from the work's thread) once the work has ended."""
        self._end_callbacks.append(callback)
        return self

    @property
    def rows(self) -> list:
        """Every update seen so far."""
        with self._lock:
            return list(self._rows)

    @property
    def done(self) -> bool:
        """The work has ended (finished, stopped or failed)."""
        return self._done.is_set()

    @property
    def stopped(self) -> bool:
        """A stop was asked for (:meth:`stop`, a Stop button, an interrupted wait)."""
        return self._stop.is_set()

    # ---- steering ---------------------------------------------------------------------

    def start(self):
        from workbench.engine.stops import handle_termination

        # A kernel told to terminate (a pod evicted) stops this work cleanly first.
        handle_termination()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the work to end after the current update; returns at once."""
        if self._stop.is_set() or self.done:
            return
        self._stop.set()
        for callback in self._stop_callbacks:
            _call(callback)

    def wait(self, timeout_s: float | None = None, *, interrupt_grace_s: float = 30.0):
        """Block until the work ends and return its result.

        Interrupting (Ctrl-C, a notebook's interrupt) while this waits asks for a stop,
        waits up to ``interrupt_grace_s`` for the work to end cleanly, and re-raises.

        Args:
            timeout_s: give up waiting after this long (the work goes on).
            interrupt_grace_s: how long an interrupted wait gives the work to end.

        Raises:
            TimeoutError: ``timeout_s`` passed first.
            KeyboardInterrupt: the wait was interrupted (the work has been stopped).
            Exception: whatever ended the work with an error, re-raised.
        """
        import time

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            # Short joins keep the waiting thread responsive to an interrupt.
            while not self._done.wait(0.2):
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"the work is still running after {timeout_s:g} s")
        except KeyboardInterrupt:
            self.stop()
            self._done.wait(interrupt_grace_s)
            raise
        if self.error is not None:
            raise self.error
        return self.result

    # ---- the work's thread ------------------------------------------------------------

    def _on_row(self, *news) -> None:
        with self._lock:
            self._rows.append(news[0] if len(news) == 1 else news)
        for callback in self._update_callbacks:
            _call(callback, *news)

    def _work(self) -> Any:
        raise NotImplementedError

    def _run(self) -> None:
        try:
            self.result = self._work()
        except BaseException as error:  # handed to wait(), which re-raises it
            self.error = error
        finally:
            if self.release_slice:
                try:
                    self.tpu_slice.release()
                except Exception:
                    log.warning("releasing the slice after the work failed", exc_info=True)
            try:
                for callback in self._end_callbacks:
                    _call(callback, self)
            finally:
                self._done.set()


def _call(callback: Callable, *args) -> None:
    # An observer's failure (a drawing problem) must not end the work.
    try:
        callback(*args)
    except Exception:
        log.warning("a run callback failed", exc_info=True)


