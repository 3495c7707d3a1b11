"""The algorithms: one module each behind one protocol (:mod:`workbench.algos.base`), and
the registry the engine finds them in by name.

>>> import workbench as wb
>>> wb.algos.names()
['impala', 'ppo', 'pqn']
>>> wb.algos.register(my_algorithm)      # an Algorithm, e.g. defined in a notebook cell

Built-in algorithms load on first use, so reading the registry imports no JAX.
"""

from __future__ import annotations

import importlib

from workbench.algos.base import (
    CONTINUOUS,
    DISCRETE,
    LOCAL,
    Agent,
    Algorithm,
    ChipMean,
    Spaces,
    Trajectory,
    join_env_columns,
)

_BUILT_IN: dict[str, str] = {
    "impala": "workbench.algos.impala:IMPALA",
    "ppo": "workbench.algos.ppo:PPO",
    "pqn": "workbench.algos.pqn:PQN",
}
_registered: dict[str, Algorithm] = {}


def register(algorithm: Algorithm, *, replace: bool = False) -> Algorithm:
    """Make ``algorithm`` trainable by its name (``TrainConfig(algo=name)``, ``--algo``).

    Args:
        algorithm: the :class:`Algorithm` record.
        replace: allow replacing an algorithm of the same name.

    Returns:
        ``algorithm``, so the call can decorate an assignment.

    Raises:
        ValueError: not an ``Algorithm``, a name that is not a plain identifier, or a name
            already taken (without ``replace``).
    """
    if not isinstance(algorithm, Algorithm):
        raise ValueError(
            f"register() takes a workbench.algos.Algorithm, got {type(algorithm).__name__}."
        )
    name = algorithm.name
    if not isinstance(name, str) or not name.replace("_", "a").replace("-", "a").isalnum():
        raise ValueError(
            f"Algorithm name {name!r} must be letters, digits, '_' or '-', such as 'reinforce'."
        )
    if not replace and name in names():
        raise ValueError(
            f"An algorithm named {name!r} is registered already; pick another name or pass "
            "replace=True."
        )
    _registered[name] = algorithm
    return algorithm


def names(action_kind: str | None = None) -> list[str]:
    """Registered algorithm names, sorted; only those for ``action_kind`` when given."""
    every = sorted(set(_BUILT_IN) | set(_registered))
    if action_kind is None:
        return every
    return [n for n in every if action_kind in get(n).action_kinds]


def get(name: str) -> Algorithm:
    """The algorithm registered as ``name``, or one named ``module:attribute``.

    Raises:
        ValueError: nothing of that name, listing the names there are.
    """
    if isinstance(name, Algorithm):
        return name
    if not isinstance(name, str):
        raise ValueError(f"algo must be an algorithm's name such as 'ppo', got {name!r}.")
    if name in _registered:
        return _registered[name]
    if name in _BUILT_IN:
        return _load(_BUILT_IN[name])
    if ":" in name:
        try:
            found = _load(name)
        except (ImportError, AttributeError) as error:
            raise ValueError(f"Cannot load algorithm {name!r}: {error}.") from None
        if isinstance(found, Algorithm):
            return found
        raise ValueError(f"{name!r} is a {type(found).__name__}, not a workbench Algorithm.")
    raise ValueError(
        f"Unknown algorithm {name!r}; available: {', '.join(names())}. Register your own "
        "with workbench.algos.register(...), or name it as 'module:attribute'."
    )


def _load(target: str):
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


__all__ = [
    "CONTINUOUS",
    "DISCRETE",
    "LOCAL",
    "Agent",
    "Algorithm",
    "ChipMean",
    "Spaces",
    "Trajectory",
    "get",
    "join_env_columns",
    "names",
    "register",
]
