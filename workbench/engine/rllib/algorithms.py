"""RLlib's algorithms by name, for the command line and the widgets: a config built from
a name, an environment and ``name=value`` settings, each value parsed by the type of the
setting's default (never evaluated). In Python, any ``AlgorithmConfig`` a user builds is
taken as it is."""

from __future__ import annotations

import difflib
import json
from typing import Any

ONLINE = ("APPO", "DQN", "IMPALA", "PPO", "SAC")
"""RLlib's algorithms that learn from an environment (the others learn from recorded data,
and need an ``.offline_data(...)`` config built in Python)."""

VALUES = (bool, int, float, str, list, tuple, dict)
"""The kinds of value a setting given as text can take (objects are set in Python)."""

RUN_SETTINGS = ("num_env_runners", "num_envs_per_env_runner")
"""Settings that belong to ``.env_runners(...)``; every other one to ``.training(...)``."""


def canonical_name(algo: str) -> str:
    """RLlib's own spelling of an online algorithm's name (``ppo`` -> ``PPO``).

    Raises:
        ValueError: not one of :data:`ONLINE`; says why (an offline algorithm) and what is.
    """
    from ray.rllib.algorithms.registry import ALGORITHMS

    by_lower = {name.lower(): name for name in ALGORITHMS}
    name = by_lower.get(algo.lower(), algo)
    if name in ONLINE:
        return name
    if name in ALGORITHMS:
        hint = (f"; {name} learns from recorded data: build its config in Python with "
                ".offline_data(...) and pass it to wb.train_rllib")
    else:
        close = _close(algo, ONLINE)
        hint = f"; did you mean {close}" if close else ""
    raise ValueError(f"RLlib algorithm {algo!r} cannot be trained from a name here: choose "
                     f"one of {', '.join(ONLINE)}{hint}.")


def _default_config(algo: str):
    from ray.rllib.algorithms.registry import ALGORITHMS

    algorithm_class, config = ALGORITHMS[canonical_name(algo)]()
    return config if config is not None else algorithm_class.get_default_config()


def _close(name: str, options) -> str | None:
    found = difflib.get_close_matches(name, list(options), n=1, cutoff=0.5) or \
        [o for o in options if o.lower() == name.lower()]
    return found[0] if found else None


def parse_setting(config, text: str) -> tuple[str, Any]:
    """``name=value`` for one of ``config``'s settings, the value parsed by the type of the
    setting's current value (numbers, booleans, lists as JSON).

    Raises:
        ValueError: no ``=``, a setting the config does not have, or a value of the
            wrong type.
    """
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name:
        raise ValueError(f"--set {text!r}: give NAME=VALUE, e.g. lr=0.0003.")
    allowed = settings_of(config)
    if name not in allowed:
        close = _close(name, allowed)
        raise ValueError(f"--set {text!r}: {type(config).__name__} has no setting {name!r}"
                         f"{f'; did you mean {close!r}' if close else ''}.")
    current = getattr(config, name)
    try:
        if isinstance(current, bool):
            if value.lower() not in ("true", "false"):
                raise ValueError
            return name, value.lower() == "true"
        if isinstance(current, int):
            return name, int(value)
        if isinstance(current, float):
            return name, float(value)
        if isinstance(current, (list, tuple, dict)):
            parsed = json.loads(value)
            if not isinstance(parsed, type(current) if not isinstance(current, tuple)
                              else list):
                raise ValueError
            return name, parsed
        if isinstance(current, str):
            return name, value
    except (ValueError, json.JSONDecodeError):
        pass
    kind = {"bool": "true or false", "int": "a whole number", "float": "a number",
            "list": "a JSON list", "tuple": "a JSON list", "dict": "a JSON object"}
    raise ValueError(f"--set {text!r}: {name} takes {kind.get(type(current).__name__, 'text')}"
                     f", like {current!r}.")


def settings_of(config) -> list[str]:
    """The settings ``--set`` can change: the config's training settings and its env
    runners' counts."""
    import inspect

    # Each algorithm's training() takes its own settings and passes the rest to its base.
    training = [name for cls in type(config).__mro__ if "training" in vars(cls)
                for name, p in inspect.signature(vars(cls)["training"]).parameters.items()
                if p.kind is p.KEYWORD_ONLY and not name.startswith("_")
                and isinstance(getattr(config, name, None), VALUES)]
    return sorted({*training, *RUN_SETTINGS})


def rllib_config(algo: str, env: str, *, seed: int = 0, settings: tuple[str, ...] = ()):
    """RLlib's default config of ``algo`` for ``env``, seeded, with ``name=value``
    settings applied (``num_env_runners`` and ``num_envs_per_env_runner`` to its env
    runners, the rest to its training settings).

    Raises:
        ValueError: an algorithm that cannot be trained from a name, or a bad setting.
    """
    config = _default_config(algo).environment(env).debugging(seed=seed)
    runners, training = {}, {}
    for text in settings:
        name, value = parse_setting(config, text)
        (runners if name in RUN_SETTINGS else training)[name] = value
    if runners:
        config.env_runners(**runners)
    if training:
        config.training(**training)
    return config
