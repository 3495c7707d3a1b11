"""The two ways a chip learns, behind one interface (``compile()``, ``step(stop)``).

============  ==============================================================  ===========
mode          what a chip runs                                                envs
============  ==============================================================  ===========
``actors``    the update, on batches from rollout actors on the hosts' CPUs   gymnasium
``anakin``    rollout of its own JAX envs and the update, in one program      JAX
============  ==============================================================  ===========
"""

from __future__ import annotations

from workbench.learn.actors_mode import BatchLearner
from workbench.learn.anakin import AnakinLearner
from workbench.learn.learner import ChipLearner

MODES: dict[str, type[ChipLearner]] = {"actors": BatchLearner, "anakin": AnakinLearner}


def learner_class(mode: str) -> type[ChipLearner]:
    """The learner of ``mode``.

    Raises:
        ValueError: an unknown mode, listing the modes.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}.")
    return MODES[mode]
