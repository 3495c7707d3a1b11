"""IMPALA (Espeholt et al., 2018) as a plug-in of the algorithm protocol: an actor-critic
whose targets are V-trace corrected, so rollout actors may run ahead of the learner
(``TrainConfig.policy_lag``) and the batches they make with older policies still teach
the current one."""

from __future__ import annotations

from workbench.algos.base import CONTINUOUS, DISCRETE, Algorithm, Spaces
from workbench.algos.impala.config import IMPALAConfig


def build(config: IMPALAConfig, spaces: Spaces, num_updates: int):
    """IMPALA's agent (see :func:`workbench.algos.impala.agent.build`)."""
    from workbench.algos.impala import agent

    return agent.build(config, spaces, num_updates)


IMPALA = Algorithm(
    name="impala",
    config_type=IMPALAConfig,
    build=build,
    action_kinds=(DISCRETE, CONTINUOUS),
    summary="IMPALA: actor-critic with V-trace targets, for lagging rollout actors",
)

__all__ = ["IMPALA", "IMPALAConfig", "build"]
