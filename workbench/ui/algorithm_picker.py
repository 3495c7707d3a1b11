"""The algorithm picker: choose an engine, an algorithm, a mode and an environment, set the
algorithm's hyperparameters, get the run's :class:`~workbench.engine.TrainConfig` (or
RLlib's ``AlgorithmConfig``).

A view over the registry and the config dataclasses: the hyperparameter boxes are built
from the chosen algorithm's config fields (their docstrings are the boxes' tooltips), so an
algorithm a user registers gets its boxes too. ``picker.config()`` is what the notebook
passes to training; every value is parsed by type, never evaluated.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets

import workbench.algos as algos
from workbench.engine.config import TrainConfig
from workbench.engine.fields import ConfigError, fields, parse_text

ENGINES = ("jax", "rllib")


class AlgorithmPicker(widgets.VBox):
    """Engine, algorithm, mode, environment and hyperparameters, as widgets.

    With the ``jax`` engine the algorithms are the registered ones and ``config()`` is a
    :class:`TrainConfig`; with ``rllib`` they are RLlib's (PPO, APPO, IMPALA, DQN, SAC), the
    boxes are the chosen algorithm's numeric and on/off training settings, and ``config()``
    is RLlib's ``AlgorithmConfig`` (one learner per chip; the ``rllib`` extra).

    Args:
        algo: the initial algorithm (a registered name, or RLlib's with ``engine="rllib"``).
        env: the initial environment id.
        mode: ``actors`` or ``anakin`` (the JAX engine's).
        engine: ``jax`` or ``rllib``.
        **train_fields: other :class:`TrainConfig` fields the config gets (budget, seed...;
            an RLlib config takes the seed).

    Raises:
        ValueError: an unknown engine or algorithm, or a field TrainConfig does not have.
    """

    def __init__(self, algo: str = "ppo", env: str = "CartPole-v1", mode: str = "actors",
                 engine: str = "jax", **train_fields: Any) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}.")
        unknown = set(train_fields) - set(fields(TrainConfig))
        if unknown:
            raise ValueError(f"TrainConfig has no field {', '.join(sorted(unknown))}.")
        self.train_fields = train_fields
        self.engine_dropdown = widgets.Dropdown(options=ENGINES, value=engine,
                                                description="Engine")
        self.algo_dropdown = widgets.Dropdown(description="Algorithm")
        self.mode_dropdown = widgets.Dropdown(options=["actors", "anakin"], value=mode,
                                              description="Mode")
        self.env_text = widgets.Text(value=env, description="Env",
                                     placeholder="CartPole-v1, gymnax:Breakout-MinAtar")
        self.summary = widgets.HTML()
        self.hyperparameters = widgets.VBox()
        self.status = widgets.HTML()
        self._boxes: dict[str, widgets.Widget] = {}
        self._defaults: dict[str, Any] = {}
        self._switching = False
        self._show_engine(algo)  # an unknown name fails here, listing the valid ones
        self.engine_dropdown.observe(lambda _change: self._show_engine(None), names="value")
        self.algo_dropdown.observe(
            lambda _change: None if self._switching else self._show_algorithm(), names="value")
        super().__init__([
            widgets.HBox([self.engine_dropdown, self.algo_dropdown, self.mode_dropdown,
                          self.env_text]),
            self.summary, self.hyperparameters, self.status,
        ])

    @property
    def engine(self) -> str:
        return self.engine_dropdown.value

    def _show_engine(self, algo: str | None) -> None:
        if self.engine == "rllib":
            from workbench.engine.rllib.algorithms import ONLINE, canonical_name

            names, algo = list(ONLINE), canonical_name(algo or "PPO")
        else:
            names = algos.names()
            algo = algos.get(algo or "ppo").name
        self.mode_dropdown.disabled = self.engine == "rllib"  # RLlib's env runners: actors
        self._switching = True  # the options' change moves the value; show it once
        try:
            self.algo_dropdown.options = names
            self.algo_dropdown.value = algo
        finally:
            self._switching = False
        self._show_algorithm()

    def _show_algorithm(self) -> None:
        if self.engine == "rllib":
            self._show_rllib_algorithm()
            return
        algorithm = algos.get(self.algo_dropdown.value)
        self.summary.value = (f"<i>{html.escape(algorithm.summary)}</i> "
                              f"({', '.join(algorithm.action_kinds)} actions)")
        self._boxes = {}
        for info in fields(algorithm.config_type).values():
            box = _box_for(info)
            if box is not None:
                self._boxes[info.name] = box
        self.hyperparameters.children = list(self._boxes.values())

    def _show_rllib_algorithm(self) -> None:
        from workbench.engine.rllib.algorithms import rllib_config, settings_of

        name = self.algo_dropdown.value
        default = rllib_config(name, self.env_text.value or "CartPole-v1")
        self.summary.value = (f"<i>RLlib's {html.escape(name)}</i>: one learner per chip, "
                              "env runners on the hosts' CPUs (the rllib extra)")
        self._boxes, self._defaults = {}, {}
        for setting in settings_of(default):
            value = getattr(default, setting)
            common = {"description": setting, "tooltip": f"RLlib's {name} setting {setting}",
                      "style": {"description_width": "160px"}}
            if isinstance(value, bool):
                box = widgets.Checkbox(value=value, **common)
            elif isinstance(value, int):
                box = widgets.IntText(value=value, **common)
            elif isinstance(value, float):
                box = widgets.FloatText(value=value, **common)
            else:
                continue  # lists, dicts and objects: set them on the config in code
            self._boxes[setting], self._defaults[setting] = box, value
        self.hyperparameters.children = list(self._boxes.values())

    def select(self, algo: str | None = None, env: str | None = None,
               mode: str | None = None, **hyperparameters: Any) -> None:
        """Set the widgets from code (what a papermill parameter does)."""
        if algo is not None:
            if self.engine == "rllib":
                from workbench.engine.rllib.algorithms import canonical_name

                self.algo_dropdown.value = canonical_name(algo)
            else:
                self.algo_dropdown.value = algos.get(algo).name
        if env is not None:
            self.env_text.value = env
        if mode is not None:
            self.mode_dropdown.value = mode
        for name, value in hyperparameters.items():
            if name not in self._boxes:
                raise ValueError(f"{self.algo_dropdown.value} has no field {name!r}; its "
                                 f"fields: {', '.join(self._boxes)}.")
            box = self._boxes[name]
            box.value = ",".join(map(str, value)) if isinstance(value, tuple) else value

    def algo_config(self) -> Any:
        """The chosen algorithm's config from the boxes.

        Raises:
            ConfigError: a box holds what its field cannot take (shown in the picker too).
        """
        algorithm = algos.get(self.algo_dropdown.value)
        known = fields(algorithm.config_type)
        values = {}
        for name, box in self._boxes.items():
            value = box.value
            values[name] = parse_text(known[name], value) if isinstance(value, str) and \
                known[name].kind != "str" else value
        return algorithm.config_type(**values)

    def config(self, **overrides: Any) -> Any:
        """The run's :class:`TrainConfig` (or, with the ``rllib`` engine, RLlib's
        ``AlgorithmConfig``), validated.

        Raises:
            ValueError: a value that cannot work, naming its field (also shown in the
                picker).
        """
        if self.engine == "rllib":
            return self._rllib_config(**overrides)
        try:
            config = TrainConfig(env=self.env_text.value, mode=self.mode_dropdown.value,
                                 algo=self.algo_dropdown.value, algo_config=self.algo_config(),
                                 **{**self.train_fields, **overrides})
            config.validate()
        except (ConfigError, ValueError, TypeError) as error:
            self.status.value = f'<span style="color:#b00020">{html.escape(str(error))}</span>'
            raise
        self.status.value = ""
        return config


    def _rllib_config(self, **overrides: Any) -> Any:
        from workbench.engine.rllib.algorithms import rllib_config

        unknown = set(overrides) - {"seed", "env"}
        if unknown:
            raise ValueError(f"An RLlib config from the picker takes seed and env, not "
                             f"{', '.join(sorted(unknown))}.")
        # Only what was changed from RLlib's defaults, so its own defaults stay in charge.
        changed = tuple(f"{name}={_as_text(box.value)}" for name, box in self._boxes.items()
                        if box.value != self._defaults[name])
        try:
            config = rllib_config(self.algo_dropdown.value,
                                  overrides.get("env", self.env_text.value),
                                  seed=overrides.get("seed", self.train_fields.get("seed", 0)),
                                  settings=changed)
        except ValueError as error:
            self.status.value = f'<span style="color:#b00020">{html.escape(str(error))}</span>'
            raise
        self.status.value = ""
        return config.learners(num_learners=0)  # 0: one learner per chip of the slice


def _as_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _box_for(info) -> widgets.Widget | None:
    common = {"description": info.name, "tooltip": info.doc,
              "style": {"description_width": "160px"}}
    kind, default = info.kind, info.default
    if kind == "bool":
        return widgets.Checkbox(value=bool(default), **common)
    if kind == "int":
        return widgets.IntText(value=int(default), **common)
    if kind == "float":
        return widgets.FloatText(value=float(default), **common)
    if kind == "choice":
        return widgets.Dropdown(options=list(info.choices), value=default, **common)
    if kind in ("ints", "strs"):
        return widgets.Text(value=",".join(map(str, default or ())), **common)
    if kind == "str":
        return widgets.Text(value=default or "", **common)
    return None  # a flax module or another object: set it in code
