"""A run on a reserved slice: the run config, the engine that places learners and rollout
actors, the run handle, metrics, checkpoints, and the result record.

Knows no algorithm's math and no mode's program: both come as data from
:mod:`workbench.algos` and :mod:`workbench.learn`.
"""

from workbench.engine.attempt import ChipLost
from workbench.engine.config import TrainConfig
from workbench.engine.driver import train
from workbench.engine.fields import ConfigError
from workbench.engine.loading import LoadedPolicy, load
from workbench.engine.result import TrainResult
from workbench.engine.run import TrainingRun, start_run

__all__ = [
    "ChipLost",
    "ConfigError",
    "LoadedPolicy",
    "TrainConfig",
    "TrainResult",
    "TrainingRun",
    "load",
    "start_run",
    "train",
]
