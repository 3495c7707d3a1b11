"""``train``: the engine a config names. A :class:`~workbench.engine.config.TrainConfig`
trains on the workbench's own JAX learners (:mod:`workbench.engine.driver`); an RLlib
``AlgorithmConfig`` on RLlib's (:mod:`workbench.engine.rllib`). Above both engines, so
neither knows the other."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workbench.engine import driver
from workbench.engine.result import TrainResult
from workbench.engine.rllib import is_rllib_config, train_rllib


def train(tpu_slice, config: Any = None, *, on_update: Callable[[dict], None] | None = None,
          should_stop: Callable[[], bool] | None = None, **watch: Any) -> TrainResult:
    """Train ``config`` on every chip of a reserved slice, blocking until the run ends.

    A ``TrainConfig`` (or None, the default run) goes to :func:`workbench.engine.driver.train`
    with ``watch`` (``poll_s``, ``recover_timeout_s``...); an RLlib ``AlgorithmConfig`` to
    :func:`workbench.engine.rllib.train_rllib` with its default options (pass
    ``wb.RLlibOptions`` to ``train_rllib`` for a budget and a folder).

    Raises:
        ValueError: as the engine's own ``train``; also ``watch`` options for RLlib.
    """
    if is_rllib_config(config):
        if watch:
            raise ValueError(f"An RLlib run takes no {', '.join(sorted(watch))}; use "
                             "wb.train_rllib(tpu_slice, config, wb.RLlibOptions(...)).")
        return train_rllib(tpu_slice, config, on_update=on_update, should_stop=should_stop)
    return driver.train(tpu_slice, config, on_update=on_update, should_stop=should_stop,
                        **watch)
