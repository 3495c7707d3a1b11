"""The RLlib engine: RLlib's own algorithms on a reserved slice, one learner per chip.

RLlib and torch are imported only when a run starts; torch is the ``rllib`` extra.
"""

from workbench.engine.rllib.run import (
    RLlibOptions,
    RLlibRun,
    is_rllib_config,
    plan_rllib,
    train_rllib,
)

__all__ = ["RLlibOptions", "RLlibRun", "is_rllib_config", "plan_rllib", "train_rllib"]
