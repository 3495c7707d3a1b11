"""PQN (Gallici et al., 2024: "Simplifying Deep Temporal Difference Learning") as a plug-in
of the algorithm protocol: Q(lambda) over the batches of vectorised envs, a LayerNorm
Q-network, an epsilon-greedy behaviour policy, and no replay buffer or target network.

Chosen over DQN for this workbench: it learns from exactly the time-major batches both
modes already make (rollout actors, or JAX envs on the chip), and its whole state is the
network and the optimizer, so the gather sync strategy hands every chip a few kilobytes
after an update where a replay buffer would be megabytes.
"""

from __future__ import annotations

from workbench.algos.base import DISCRETE, Algorithm, Spaces
from workbench.algos.pqn.config import PQNConfig


def build(config: PQNConfig, spaces: Spaces, num_updates: int):
    """PQN's :class:`~workbench.algos.base.Agent` (see :func:`workbench.algos.pqn.agent.build`)."""
    from workbench.algos.pqn import agent

    return agent.build(config, spaces, num_updates)


PQN = Algorithm(
    name="pqn",
    config_type=PQNConfig,
    build=build,
    action_kinds=(DISCRETE,),
    summary="PQN: parallel Q(lambda) without a replay buffer or target network (discrete)",
)

__all__ = ["PQN", "PQNConfig", "build"]
