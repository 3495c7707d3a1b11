"""A run on a reserved slice: the run config, the engine that places learners and rollout
actors, the run handle, metrics, checkpoints, and the result record.

Knows no algorithm's math and no mode's program: both come as data from
:mod:`workbench.algos` and :mod:`workbench.learn`.
"""

from workbench.train.attempt import ChipLost
from workbench.train.config import TrainConfig
from workbench.train.engine import train
from workbench.train.fields import ConfigError
from workbench.train.result import TrainResult
from workbench.train.run import TrainingRun, start_run

__all__ = ["ChipLost", "ConfigError", "TrainConfig", "TrainResult", "TrainingRun", "start_run",
           "train"]
