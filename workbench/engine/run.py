"""A training run in the background: start it, watch its progress, stop it, wait for it.

``TrainingRun`` runs :func:`workbench.engine.driver.train` in a thread, so the caller (a
notebook kernel, the CLI) stays free. Observers register callbacks; the handle itself
knows nothing of widgets or terminals, and the dashboard and ``workbench train`` are both
observers of the same handle.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

from workbench.engine.config import TrainConfig
from workbench.engine.result import TrainResult

log = logging.getLogger(__name__)

UpdateCallback = Callable[[dict], None]
EndCallback = Callable[["TrainingRun"], None]


class TrainingRun:
    """One run on a reserved slice, going on in a background thread.

    Args:
        tpu_slice: a reserved slice.
        config: what to learn (the engine's default when None).
        release_slice: release the slice when training ends (finished, stopped or failed).
        **train_kwargs: how the run is watched, as for :func:`workbench.engine.driver.train`
            (``poll_s``, ``recover_timeout_s``...).

    Raises:
        ValueError: a config or slice that cannot work (nothing is started), or a
            keyword the handle drives itself.
    """

    def __init__(self, tpu_slice, config: TrainConfig | None = None, *,
                 release_slice: bool = False, **train_kwargs: Any) -> None:
        from workbench.engine.plan import check_slice, plan_run

        self.config = config or TrainConfig()
        # Fail in the calling cell, not later in the thread.
        self.plan = plan_run(self.config)
        check_slice(self.plan, tpu_slice)
        from workbench.engine.driver import WatchOptions

        for driven in ("on_update", "should_stop"):
            if driven in train_kwargs:
                raise ValueError(f"{driven} is driven by the run handle: use "
                                 f"run.on_update(...) and run.stop() instead.")
        allowed = {f.name for f in dataclasses.fields(WatchOptions)} - {"on_update",
                                                                         "should_stop"}
        unknown = sorted(set(train_kwargs) - allowed)
        if unknown:
            raise ValueError(f"TrainingRun got unknown options {', '.join(unknown)}; it takes "
                             f"{', '.join(sorted(allowed))}.")
        self.tpu_slice = tpu_slice
        self.release_slice = release_slice
        self.result: TrainResult | None = None
        self.error: BaseException | None = None
        self._train_kwargs = train_kwargs
        self._rows: list[dict] = []
        self._update_callbacks: list[UpdateCallback] = []
        self._stop_callbacks: list[Callable[[], None]] = []
        self._end_callbacks: list[EndCallback] = []
        self._stop = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="workbench-training", daemon=True)

    # ---- observing --------------------------------------------------------------------

    def on_update(self, callback: UpdateCallback) -> TrainingRun:
        """Call ``callback(row)`` (from the training thread) for every update's row."""
        self._update_callbacks.append(callback)
        return self

    def on_stop(self, callback: Callable[[], None]) -> TrainingRun:
        """Call ``callback()`` when a stop is asked for (from whichever thread asked)."""
        self._stop_callbacks.append(callback)
        return self

    def on_end(self, callback: EndCallback) -> TrainingRun:
        """Call ``callback(run)`` (from the training thread) once training has ended."""
        self._end_callbacks.append(callback)
        return self

    @property
    def run_dir(self) -> str:
        """The run's folder (checkpoints, ``run.json``, ``result.json``)."""
        return self.plan.run_dir

    @property
    def target_return(self) -> float | None:
        """The return the run's targets are measured against (None: the env has none)."""
        return self.plan.target_return

    @property
    def rows(self) -> list[dict]:
        """Every update row seen so far."""
        with self._lock:
            return list(self._rows)

    @property
    def done(self) -> bool:
        """Training has ended (finished, stopped or failed)."""
        return self._done.is_set()

    @property
    def stopped(self) -> bool:
        """A stop was asked for (:meth:`stop`, a Stop button, an interrupted wait)."""
        return self._stop.is_set()

    # ---- steering ---------------------------------------------------------------------

    def start(self) -> TrainingRun:
        from workbench.engine.stops import handle_termination

        # A kernel told to terminate (a pod evicted) stops this run cleanly first.
        handle_termination()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask training to end after the current update; returns at once.

        With a ``checkpoint_dir`` in the config the learners write a final checkpoint.
        """
        if self._stop.is_set() or self.done:
            return
        self._stop.set()
        for callback in self._stop_callbacks:
            _call(callback)

    def wait(self, timeout_s: float | None = None, *,
             interrupt_grace_s: float = 30.0) -> TrainResult:
        """Block until training ends and return its result.

        Interrupting (Ctrl-C, a notebook's interrupt) while this waits asks for a stop,
        waits up to ``interrupt_grace_s`` for training to end cleanly, and re-raises.

        Args:
            timeout_s: give up waiting after this long (training goes on).
            interrupt_grace_s: how long an interrupted wait gives training to end.

        Raises:
            TimeoutError: ``timeout_s`` passed first.
            KeyboardInterrupt: the wait was interrupted (training has been stopped).
            Exception: whatever ended training with an error, re-raised.
        """
        import time

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            # Short joins keep the waiting thread responsive to an interrupt.
            while not self._done.wait(0.2):
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"training is still running after {timeout_s:g} s")
        except KeyboardInterrupt:
            self.stop()
            self._done.wait(interrupt_grace_s)
            raise
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result

    # ---- the training thread ----------------------------------------------------------

    def _on_row(self, row: dict) -> None:
        with self._lock:
            self._rows.append(row)
        for callback in self._update_callbacks:
            _call(callback, row)

    def _run(self) -> None:
        from workbench.engine.driver import WatchOptions, run_planned

        options = WatchOptions(on_update=self._on_row, should_stop=self._stop.is_set,
                               **self._train_kwargs)
        try:
            self.result = run_planned(self.tpu_slice, self.plan, options)
        except BaseException as error:  # handed to wait(), which re-raises it
            self.error = error
        finally:
            if self.release_slice:
                try:
                    self.tpu_slice.release()
                except Exception:
                    log.warning("releasing the slice after training failed", exc_info=True)
            try:
                for callback in self._end_callbacks:
                    _call(callback, self)
            finally:
                self._done.set()


def _call(callback: Callable, *args) -> None:
    # An observer's failure (a drawing problem) must not end a training run.
    try:
        callback(*args)
    except Exception:
        log.warning("a training-run callback failed", exc_info=True)


def start_run(tpu_slice, config: TrainConfig | None = None, **kwargs: Any) -> TrainingRun:
    """Start training in the background; returns the running :class:`TrainingRun`."""
    return TrainingRun(tpu_slice, config, **kwargs).start()
