"""Work on a reserved slice in the background: start it, watch its progress, stop it, wait.

``TrainingRun`` runs :func:`workbench.engine.driver.train` in a thread, and ``SweepRun`` a
sweep (:mod:`workbench.engine.sweep`), so the caller (a notebook kernel, the CLI) stays
free. Observers register callbacks; the handles know nothing of widgets or terminals, and
the dashboards and the command line are all observers of the same handles.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from workbench.engine.background import BackgroundRun
from workbench.engine.config import TrainConfig
from workbench.engine.result import TrainResult


class TrainingRun(BackgroundRun):
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
        from workbench.engine.driver import WatchOptions
        from workbench.engine.plan import check_slice, plan_run

        super().__init__(tpu_slice, release_slice=release_slice)
        self.config = config or TrainConfig()
        # Fail in the calling cell, not later in the thread.
        self.plan = plan_run(self.config)
        check_slice(self.plan, tpu_slice)
        _check_options(train_kwargs, {f.name for f in dataclasses.fields(WatchOptions)})
        self._train_kwargs = train_kwargs
        self.result: TrainResult | None = None

    @property
    def run_dir(self) -> str:
        """The run's folder (checkpoints, ``run.json``, ``result.json``)."""
        return self.plan.run_dir

    @property
    def target_return(self) -> float | None:
        """The return the run's targets are measured against (None: the env has none)."""
        return self.plan.target_return

    def _work(self) -> TrainResult:
        from workbench.engine.driver import WatchOptions, run_planned

        options = WatchOptions(on_update=self._on_row, should_stop=self._stop.is_set,
                               **self._train_kwargs)
        return run_planned(self.tpu_slice, self.plan, options)


class SweepRun(BackgroundRun):
    """A sweep on a reserved slice, going on in a background thread; its updates come to
    observers as ``(trial, row)``.

    Args:
        tpu_slice: a reserved slice.
        config: the base run.
        release_slice: release the slice when the sweep ends.
        seeds: the seeds, as for :func:`workbench.engine.sweep.sweep`.
        grid: the grid, as for :func:`workbench.engine.sweep.sweep`.
        **options: ``poll_s``, ``distributed_timeout_s``.

    Raises:
        ValueError: a sweep that cannot work (nothing is started).
    """

    def __init__(self, tpu_slice, config: TrainConfig | None = None, *,
                 release_slice: bool = False, seeds: Any = 8, grid: Any = None,
                 **options: Any) -> None:
        from workbench.engine.sweep import plan_sweep

        super().__init__(tpu_slice, release_slice=release_slice)
        self.config = config or TrainConfig(mode="anakin")
        self.plan = plan_sweep(tpu_slice, self.config, seeds, grid)
        _check_options(options, {"poll_s", "distributed_timeout_s"})
        self._options = options

    def _work(self):
        from workbench.engine.sweep import run_sweep

        return run_sweep(self.tpu_slice, self.plan, on_update=self._on_row,
                         should_stop=self._stop.is_set, **self._options)


def _check_options(given: dict, allowed: set[str]) -> None:
    for driven in ("on_update", "should_stop"):
        if driven in given:
            raise ValueError(f"{driven} is driven by the run handle: use "
                             f"run.on_update(...) and run.stop() instead.")
    unknown = sorted(set(given) - (allowed - {"on_update", "should_stop"}))
    if unknown:
        raise ValueError(f"got unknown options {', '.join(unknown)}; the handle takes "
                         f"{', '.join(sorted(allowed - {'on_update', 'should_stop'}))}.")


def start_run(tpu_slice, config: TrainConfig | None = None, **kwargs: Any) -> TrainingRun:
    """Start training in the background; returns the running :class:`TrainingRun`."""
    return TrainingRun(tpu_slice, config, **kwargs).start()
