"""Checkpoints of a run's learner state with orbax.

Every chip holds the same parameters after each update, so one copy is enough: the chip
of rank 0 writes it, as numpy, and a restore loads it onto every chip. The directory
layout is orbax's own (one numbered step folder each), so orbax tools can read it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


class CheckpointError(ValueError):
    """A path that holds no workbench checkpoint."""


def _manager(directory: str, create: bool):
    import jax
    import orbax.checkpoint as ocp

    # NOTE: only one process of the slice saves or restores, so orbax must not wait at
    # cross-process barriers for the others.
    me = jax.process_index()
    if create:
        os.makedirs(directory, exist_ok=True)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=3,
        create=False,
        multiprocessing_options=ocp.options.MultiprocessingOptions(
            primary_host=me, active_processes={me}
        ),
        enable_async_checkpointing=False,
    )
    return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def pack(leaves: list, **scalars) -> dict:
    """A checkpointable dict from an ordered list of arrays; keys keep the order."""
    return {"leaves": {f"{i:05d}": np.asarray(x) for i, x in enumerate(leaves)}, **scalars}


def unpack(state: dict) -> list:
    return [state["leaves"][k] for k in sorted(state["leaves"])]


def save(directory: str, step: int, state: dict) -> str:
    """Write ``state`` (see :func:`pack`) as checkpoint ``step``."""
    import orbax.checkpoint as ocp

    with _manager(directory, create=True) as manager:
        manager.save(step, args=ocp.args.PyTreeSave(state), force=True)
        manager.wait_until_finished()
    return str(Path(directory, str(step)))


def latest_step(directory: str) -> int | None:
    path = Path(directory)
    if not path.is_dir():
        return None
    steps = [int(p.name) for p in path.iterdir() if p.is_dir() and p.name.isdigit()]
    return max(steps) if steps else None


def require_checkpoint(directory: object) -> int:
    """The latest step of a checkpoint directory a run is asked to resume from.

    Args:
        directory: the ``checkpoint_dir`` of an earlier run.

    Returns:
        The number of its latest checkpoint.

    Raises:
        CheckpointError: ``directory`` is not a path, does not exist, is a file, or holds no
            checkpoint; the message says which, and what to pass instead.
    """
    advice = ("Pass the checkpoint_dir of an earlier run (--checkpoint-dir), or leave resume "
              "off to start fresh.")
    if not isinstance(directory, (str, os.PathLike)) or not str(directory):
        raise CheckpointError(
            f"checkpoint_dir must be a directory path, got {directory!r}. {advice}"
        )
    path = Path(directory)
    if not path.exists():
        raise CheckpointError(f"Checkpoint directory {str(path)!r} does not exist. {advice}")
    if not path.is_dir():
        raise CheckpointError(
            f"{str(path)!r} is a file, not a checkpoint directory. {advice}"
        )
    found = latest_step(str(path))
    if found is None:
        raise CheckpointError(
            f"{str(path)!r} holds no workbench checkpoint (expected numbered step folders "
            f"written by a run with checkpoint_dir set). {advice}"
        )
    return found


def restore(directory: str, step: int | None = None) -> dict:
    """Load checkpoint ``step`` (default: the latest) of ``directory`` as numpy pytrees.

    Raises:
        CheckpointError: the directory does not exist or holds no checkpoint.
    """
    import orbax.checkpoint as ocp

    found = require_checkpoint(directory)
    step = found if step is None else step
    with _manager(directory, create=False) as manager:
        restored = manager.restore(step, args=ocp.args.PyTreeRestore())
    return _as_numpy(restored)


def _as_numpy(tree):
    if isinstance(tree, dict):
        return {k: _as_numpy(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_as_numpy(v) for v in tree)
    return np.asarray(tree)
