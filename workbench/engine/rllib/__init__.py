"""The RLlib engine: RLlib's own algorithms on a reserved slice, one learner per chip.

RLlib and torch are imported only when a run starts; torch is the ``rllib`` extra.
"""

from workbench.engine.rllib.run import RLlibOptions, is_rllib_config, train_rllib

__all__ = ["RLlibOptions", "is_rllib_config", "train_rllib"]
