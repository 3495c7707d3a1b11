"""A run on a reserved slice: the run config, the engine that places learners and rollout
actors, the run handles, metrics, checkpoints, the result record; sweeps of many trials,
tracking, and a trained policy evaluated or served.

Knows no algorithm's math and no mode's program: both come as data from
:mod:`workbench.algos` and :mod:`workbench.learn`.
"""

from workbench.engine.config import TrainConfig
from workbench.engine.engines import train
from workbench.engine.fields import ConfigError
from workbench.engine.loading import LoadedPolicy, load
from workbench.engine.playback import evaluate_run
from workbench.engine.restarts import ChipLost
from workbench.engine.result import TrainResult
from workbench.engine.rllib import RLlibOptions, train_rllib
from workbench.engine.run import SweepRun, TrainingRun, start_run
from workbench.engine.serving import PolicyServer, serve_policy
from workbench.engine.sweep import SweepResult, sweep
from workbench.engine.warm import start_learners

__all__ = [
    "ChipLost",
    "ConfigError",
    "LoadedPolicy",
    "PolicyServer",
    "RLlibOptions",
    "SweepResult",
    "SweepRun",
    "TrainConfig",
    "TrainResult",
    "TrainingRun",
    "evaluate_run",
    "load",
    "serve_policy",
    "start_learners",
    "start_run",
    "sweep",
    "train",
    "train_rllib",
]
