"""The algorithm picker: choose an algorithm, a mode and an environment, set the
algorithm's hyperparameters, get the run's :class:`~workbench.engine.TrainConfig`.

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


class AlgorithmPicker(widgets.VBox):
    """Algorithm, mode, environment and hyperparameters, as widgets.

    Args:
        algo: the initial algorithm (a registered name).
        env: the initial environment id.
        mode: ``actors`` or ``anakin``.
        **train_fields: other :class:`TrainConfig` fields the config gets (budget, seed...).

    Raises:
        ValueError: an unknown algorithm, or a field TrainConfig does not have.
    """

    def __init__(self, algo: str = "ppo", env: str = "CartPole-v1", mode: str = "actors",
                 **train_fields: Any) -> None:
        algos.get(algo)  # an unknown name fails here, listing the registered ones
        unknown = set(train_fields) - set(fields(TrainConfig))
        if unknown:
            raise ValueError(f"TrainConfig has no field {', '.join(sorted(unknown))}.")
        self.train_fields = train_fields
        self.algo_dropdown = widgets.Dropdown(options=algos.names(), value=algo,
                                              description="Algorithm")
        self.mode_dropdown = widgets.Dropdown(options=["actors", "anakin"], value=mode,
                                              description="Mode")
        self.env_text = widgets.Text(value=env, description="Env",
                                     placeholder="CartPole-v1, gymnax:Breakout-MinAtar")
        self.summary = widgets.HTML()
        self.hyperparameters = widgets.VBox()
        self.status = widgets.HTML()
        self._boxes: dict[str, widgets.Widget] = {}
        self.algo_dropdown.observe(lambda _change: self._show_algorithm(), names="value")
        self._show_algorithm()
        super().__init__([
            widgets.HBox([self.algo_dropdown, self.mode_dropdown, self.env_text]),
            self.summary, self.hyperparameters, self.status,
        ])

    def _show_algorithm(self) -> None:
        algorithm = algos.get(self.algo_dropdown.value)
        self.summary.value = (f"<i>{html.escape(algorithm.summary)}</i> "
                              f"({', '.join(algorithm.action_kinds)} actions)")
        self._boxes = {}
        for info in fields(algorithm.config_type).values():
            box = _box_for(info)
            if box is not None:
                self._boxes[info.name] = box
        self.hyperparameters.children = list(self._boxes.values())

    def select(self, algo: str | None = None, env: str | None = None,
               mode: str | None = None, **hyperparameters: Any) -> None:
        """Set the widgets from code (what a papermill parameter does)."""
        if algo is not None:
            algos.get(algo)
            self.algo_dropdown.value = algo
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

    def config(self, **overrides: Any) -> TrainConfig:
        """The run's :class:`TrainConfig`, validated.

        Raises:
            ValueError: a value that cannot work, naming its field (also shown in the
                picker).
        """
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
