"""Experiment tracking: a run's curve, evaluations and config written where a user's tools
read them, TensorBoard event files in the run's folder or an MLflow run.

A tracker is an observer on the driver: it gets the rows the driver already receives (one
per update, after the chips' records are joined), so tracking adds nothing to the chips'
loop. The backends are optional extras (``pip install 'tpu-rl-workbench[track]'``).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

BACKENDS = ("tensorboard", "mlflow")
EXTRA = "pip install 'tpu-rl-workbench[track]'"

# Row fields that are numbers worth a curve; the rest (lists, times) are not.
_SKIPPED = {"update", "time", "chip_step_s", "policy_versions"}


class Tracker(Protocol):
    """Where one run's numbers go."""

    def log_config(self, config: Mapping[str, Any]) -> None: ...
    def log_row(self, row: Mapping[str, Any]) -> None: ...
    def log_eval(self, evaluation: Mapping[str, Any]) -> None: ...
    def log_result(self, result: Mapping[str, Any]) -> None: ...
    def close(self) -> None: ...


def check_backend(backend: str | None) -> None:
    """Refuse an unknown backend, or one whose package is missing, before a run starts.

    Raises:
        ConfigError: naming the backends, or the extra to install.
    """
    import importlib.util

    from workbench.engine.fields import ConfigError

    if backend is None:
        return
    if backend not in BACKENDS:
        raise ConfigError("track", f"must be one of {', '.join(BACKENDS)} (or None), got "
                                   f"{backend!r}.")
    module = "tensorboardX" if backend == "tensorboard" else "mlflow"
    if importlib.util.find_spec(module) is None:
        raise ConfigError("track", f"={backend} needs the {module} package: {EXTRA}.")


def make_tracker(backend: str | None, run_dir: str, run_name: str,
                 tracking_uri: str | None = None) -> Tracker | None:
    """The tracker of ``backend`` for the run in ``run_dir`` (None: no tracking)."""
    check_backend(backend)
    if backend is None:
        return None
    if backend == "tensorboard":
        return TensorBoardTracker(str(Path(run_dir) / "tensorboard"))
    return MLflowTracker(run_name, tracking_uri or default_mlflow_uri(run_dir))


def default_mlflow_uri(run_dir: str) -> str:
    """A local MLflow file store beside the run folders (``<runs>/mlruns``)."""
    return (Path(run_dir).parent / "mlruns").resolve().as_uri()


def scalars_of(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a row, by name (booleans and missing values left out)."""
    out = {}
    for key, value in row.items():
        if key in _SKIPPED or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``name: value`` pairs of plain types (what hparams take)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        if isinstance(value, Mapping):
            flat.update(flat_config(value, name + "."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        elif value is None:
            flat[name] = "None"
        else:
            flat[name] = str(value)
    return flat


class TensorBoardTracker:
    """Event files in ``<run_dir>/tensorboard``: every row's numbers under ``train/``, each
    evaluation under ``eval/``, the config as TensorBoard hparams (in the same run, so the
    HParams tab lists the run with its curves). TensorFlow is not needed to write or read
    them: ``tensorboard --logdir runs/``."""

    def __init__(self, logdir: str) -> None:
        from tensorboardX import SummaryWriter

        os.makedirs(logdir, mode=0o700, exist_ok=True)
        self.logdir = logdir
        self.writer = SummaryWriter(logdir=logdir)
        self._hparams: dict[str, Any] | None = None

    def log_config(self, config: Mapping[str, Any]) -> None:
        # The hparams summary goes out at the end, with the final metrics, so that the
        # HParams tab shows each run's outcome beside its config.
        self._hparams = flat_config(config)

    def log_row(self, row: Mapping[str, Any]) -> None:
        step = int(row["env_steps"])
        for key, value in scalars_of(row).items():
            self.writer.add_scalar(f"train/{key}", value, global_step=step)

    def log_eval(self, evaluation: Mapping[str, Any]) -> None:
        step = int(evaluation["env_steps"])
        self.writer.add_scalar("eval/mean_return", float(evaluation["mean_return"]),
                               global_step=step)

    def log_result(self, result: Mapping[str, Any]) -> None:
        from tensorboardX.summary import hparams

        final = {f"result/{k}": v for k, v in scalars_of(result).items()}
        for summary in hparams(self._hparams or {}, final):
            # NOTE: written into this run's own file: SummaryWriter.add_hparams would open a
            # second writer in a sub-folder, a separate run in TensorBoard's eyes.
            self.writer.file_writer.add_summary(summary)
        for key, value in final.items():
            self.writer.add_scalar(key, value, global_step=int(result.get("env_steps", 0)))

    def close(self) -> None:
        self.writer.close()


class MLflowTracker:
    """One MLflow run: the config as params, every row's numbers and each evaluation as
    step metrics (the step is the env-step count), the result as final metrics."""

    def __init__(self, run_name: str, tracking_uri: str, experiment: str = "workbench") -> None:
        if tracking_uri.startswith("file:"):
            # NOTE: MLflow 3.13+ refuses its file store unless asked for it explicitly;
            # a local folder beside the runs is what a user without a server wants.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else \
            self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        self.tracking_uri = tracking_uri

    def log_config(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, str(v)[:500]) for k, v in flat_config(config).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 per batch
            self.client.log_batch(self.run_id, params=params[start:start + 100])

    def _metrics(self, values: Mapping[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in values.items()]
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 1000])

    def log_row(self, row: Mapping[str, Any]) -> None:
        self._metrics({f"train/{k}": v for k, v in scalars_of(row).items()},
                      int(row["env_steps"]))

    def log_eval(self, evaluation: Mapping[str, Any]) -> None:
        self._metrics({"eval/mean_return": float(evaluation["mean_return"])},
                      int(evaluation["env_steps"]))

    def log_result(self, result: Mapping[str, Any]) -> None:
        self._metrics({f"result/{k}": v for k, v in scalars_of(result).items()},
                      int(result.get("env_steps", 0)))

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
