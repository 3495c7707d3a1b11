"""A Jupyter-first reinforcement-learning workbench for Cloud TPU slices on Ray and JAX.

The few names a notebook needs::

    import workbench as wb
    cluster = wb.local_cluster([("v6e", "2x2")])      # or wb.connect("ray://head:10001")
    with wb.reserve("v6e", "2x2", cpus_per_chip=2) as tpu_slice:
        result = wb.train(tpu_slice, wb.TrainConfig(env="CartPole-v1"))
        sweep = wb.sweep(tpu_slice, wb.TrainConfig(mode="anakin", env="workbench/CartPole-v1"),
                         seeds="0-63", grid={"ppo.learning_rate": [1e-3, 5e-4]})
    report = wb.plan(("v6e", "4x4"), wb.TrainConfig(env="CartPole-v1"))  # fits? (libtpu)

The layers are packages: :mod:`workbench.tpu` (where chips come from),
:mod:`workbench.engine` (a run on a slice), :mod:`workbench.learn` (what a chip runs),
:mod:`workbench.algos` (the math), :mod:`workbench.envs` and :mod:`workbench.ui`.
"""

from __future__ import annotations

from workbench import algos as algos
from workbench import envs as envs  # registers the workbench/* ids with gymnasium
from workbench.tpu import (
    CatalogError,
    ClusterError,
    LocalCluster,
    Slice,
    SliceShape,
    SliceUnavailableError,
    connect,
    disconnect,
    join_or_start,
    list_slices,
    local_cluster,
    parse_shape,
    reserve,
    topologies,
)
from workbench.version import version

__version__ = version()

from workbench.engine import (
    LoadedPolicy,
    RLlibOptions,
    SweepResult,
    SweepRun,
    TrainConfig,
    TrainingRun,
    TrainResult,
    evaluate_run,
    load,
    serve_policy,
    start_learners,
    start_run,
    sweep,
    train,
    train_rllib,
)
from workbench.engine.fit import FitReport
from workbench.engine.fit import plan_fit as plan

__all__ = [
    "CatalogError",
    "ClusterError",
    "FitReport",
    "LoadedPolicy",
    "RLlibOptions",
    "SweepResult",
    "SweepRun",
    "LocalCluster",
    "Slice",
    "SliceShape",
    "SliceUnavailableError",
    "TrainConfig",
    "TrainResult",
    "TrainingRun",
    "__version__",
    "algos",
    "connect",
    "disconnect",
    "envs",
    "evaluate_run",
    "join_or_start",
    "list_slices",
    "load",
    "local_cluster",
    "parse_shape",
    "plan",
    "reserve",
    "serve_policy",
    "start_learners",
    "start_run",
    "sweep",
    "topologies",
    "train",
    "train_rllib",
]
