"""A run's own folder: ``run.json`` (what it is), ``result.json`` (what it did) and its
``checkpoints/``. Private to the user who ran it."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from workbench.engine.checkpoint import is_remote, make_private_dir


def _write(path: Path, record: dict) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(record, indent=1, default=str))
    os.replace(partial, path)


def write_json(path: str, record: dict) -> None:
    """A JSON record written whole or not at all (a local path)."""
    if not is_remote(path):
        _write(Path(path), record)


def write_run_record(plan, identity: dict) -> None:
    """Create the run's folder and record what the run is (kept when a run resumes)."""
    if is_remote(plan.run_dir):
        return
    folder = make_private_dir(plan.run_dir)
    record = {
        **identity,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "checkpoint_dir": plan.checkpoint_dir,
        "config": {f.name: getattr(plan.config, f.name)
                   for f in dataclasses.fields(plan.config) if f.name != "algo_config"},
    }
    path = folder / "run.json"
    if not path.exists():
        _write(path, record)


def write_result(plan, result) -> None:
    if is_remote(plan.run_dir):
        return
    _write(Path(plan.run_dir) / "result.json", result.to_json())
