"""Checkpoints a run can trust: the learner state with its run's identity and a digest.

Every chip holds the same learner state after each update, so one copy is enough: the chip
of rank 0 writes it, as numpy, with orbax (one numbered step folder each, orbax's own
layout). Beside the arrays, each step folder holds ``workbench.json``: which run wrote it
(env, algorithm and its config, spaces, slice shape, seed, workbench version), the update
and env steps, and a SHA-256 over everything saved. A resumed run checks all of it:

- another env, algorithm or network is refused, naming both;
- a step whose digest or files do not check out is skipped for the one before it, with a
  warning (orbax keeps the last three);
- a directory holding another run's checkpoints is refused unless the run continues it.

What makes a resume exact travels too: the policy the in-flight rollout was asked for and
each rollout actor's envs (actors mode), or every chip's environments (Anakin mode). The
rollout actors' envs are pickled; they are only ever unpickled from a directory that this
user owns and nobody else can write.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

META = "workbench.json"
FORMAT = 2
KEEP = 3
# The identity fields a resumed run must share with the checkpoint it continues.
IDENTITY = ("env", "algo", "algo_config", "spaces")


class CheckpointError(ValueError):
    """A path that holds no usable workbench checkpoint, or one another run wrote."""


@dataclass
class Restored:
    """A checkpoint read back: where it is, what wrote it, and what it holds."""

    step: int
    path: str
    meta: dict
    state: list[np.ndarray]
    resume: dict = field(default_factory=dict)
    """numpy pytrees that make a resume exact (mode-specific), possibly empty."""
    rollouts: list[bytes] = field(default_factory=list)
    """Each rollout actor's pickled envs, in actor order (actors mode), possibly empty."""

    @property
    def update(self) -> int:
        return int(self.meta["update"])

    @property
    def env_steps(self) -> int:
        return int(self.meta["env_steps"])


# ---- the directory ----------------------------------------------------------------------

def is_remote(directory: str) -> bool:
    """A bucket path (``gs://…``), which orbax writes itself; no local permissions apply."""
    return "://" in str(directory)


def make_private_dir(directory: str | os.PathLike) -> Path:
    """Create ``directory`` readable and writable by this user only (or check it is).

    Raises:
        CheckpointError: it exists and others can write it, or it is someone else's.
    """
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    check_private(path)
    return path


def check_private(path: Path) -> None:
    """Raise :class:`CheckpointError` unless ``path`` is this user's and nobody else can
    write it: what is unpickled from it must be what this user wrote."""
    info = path.stat()
    if info.st_uid != os.getuid():
        raise CheckpointError(
            f"{str(path)!r} belongs to another user (uid {info.st_uid}); checkpoints and "
            "caches must be your own. Choose a directory of yours."
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CheckpointError(
            f"{str(path)!r} can be written by others (mode {stat.filemode(info.st_mode)}); "
            f"make it private (chmod go-w {path}) or choose another directory."
        )


def steps(directory: str) -> list[int]:
    """The step numbers in ``directory``, newest first."""
    path = Path(directory)
    if not path.is_dir():
        return []
    return sorted((int(p.name) for p in path.iterdir() if p.is_dir() and p.name.isdigit()),
                  reverse=True)


def latest_step(directory: str) -> int | None:
    found = steps(directory)
    return found[0] if found else None


def read_meta(directory: str, step: int) -> dict | None:
    """The ``workbench.json`` of a step, or None if it is missing or unreadable."""
    try:
        meta = json.loads((Path(directory) / str(step) / META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None


def latest_meta(directory: str) -> dict | None:
    """The identity of the newest step with a readable ``workbench.json``."""
    for step in steps(directory):
        meta = read_meta(directory, step)
        if meta is not None:
            return meta
    return None


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


# ---- identity ---------------------------------------------------------------------------

def describe(meta: dict) -> str:
    return (f"run {meta.get('run_id', '?')}: {meta.get('algo')} on {meta.get('env')}, seed "
            f"{meta.get('seed')}, {meta.get('slice', {}).get('generation')} "
            f"{meta.get('slice', {}).get('topology')}, update {meta.get('update')}")


def check_fresh(directory: str) -> None:
    """A run that does not resume must not write into another run's checkpoints.

    Raises:
        CheckpointError: ``directory`` holds checkpoints already.
    """
    meta = latest_meta(directory)
    if meta is not None or latest_step(directory) is not None:
        written = describe(meta) if meta else "an earlier run"
        raise CheckpointError(
            f"checkpoint_dir {directory!r} holds checkpoints of {written}. Pass resume=True "
            "(--resume) to continue that run, or choose another checkpoint_dir."
        )


def check_compatible(meta: dict, identity: dict, directory: str) -> None:
    """Compare a checkpoint with the run that wants to continue it.

    Raises:
        CheckpointError: another env, algorithm, algorithm config or spaces, naming both.
    """
    for key in IDENTITY:
        written, wanted = _plain(meta.get(key)), _plain(identity.get(key))
        if written == wanted:
            continue
        if isinstance(written, dict) and isinstance(wanted, dict):
            # Name only the entries that differ (a config has dozens of fields).
            keys = sorted({k for k in written.keys() | wanted.keys()
                           if written.get(k) != wanted.get(k)})
            written = {k: written.get(k) for k in keys}
            wanted = {k: wanted.get(k) for k in keys}
        raise CheckpointError(
            f"The checkpoints in {directory!r} were written with {key} {_shown(written)}, "
            f"and this run has {key} {_shown(wanted)}. Resume with the same {key}, or start "
            "fresh in another checkpoint_dir."
        )


def slice_note(meta: dict, shape_record: dict) -> str | None:
    """What a resume on another slice shape changes, or None for the same shape: the
    state is replicated, so it continues on any number of chips; the envs start afresh."""
    written = meta.get("slice") or {}
    if written == shape_record:
        return None
    return (f"the checkpoint was written on a {written.get('generation')} "
            f"{written.get('topology')} slice; its state continues on this "
            f"{shape_record['generation']} {shape_record['topology']} one, with fresh "
            "environments")


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str)) if value is not None else None


def _shown(value: Any, limit: int = 120) -> str:
    text = json.dumps(_plain(value))
    return text if len(text) <= limit else text[:limit] + "..."


# ---- saving and restoring ---------------------------------------------------------------

def _manager(directory: str, create: bool):
    import jax
    import orbax.checkpoint as ocp

    # NOTE: only one process of the slice saves or restores, so orbax must not wait at
    # cross-process barriers for the others.
    me = jax.process_index()
    if create and not is_remote(directory):
        make_private_dir(directory)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=KEEP,
        create=False,
        multiprocessing_options=ocp.options.MultiprocessingOptions(
            primary_host=me, active_processes={me}
        ),
        enable_async_checkpointing=False,
    )
    return ocp.CheckpointManager(
        directory if is_remote(directory) else os.path.abspath(directory), options=options
    )


def _numbered(leaves: list) -> dict:
    return {f"{i:05d}": np.asarray(x) for i, x in enumerate(leaves)}


def _unnumbered(tree: dict) -> list:
    return [tree[k] for k in sorted(tree)]


def digest_of(state: list, resume_leaves: list, rollouts: list[bytes]) -> str:
    digest = hashlib.sha256()
    for leaf in [*state, *resume_leaves]:
        array = np.ascontiguousarray(leaf)
        digest.update(str((array.shape, array.dtype.str)).encode())
        digest.update(array.tobytes())
    for blob in rollouts:
        digest.update(hashlib.sha256(blob).digest())
    return digest.hexdigest()


def save(directory: str, step: int, state: list, meta: dict, *, resume: dict | None = None,
         rollouts: list[bytes] | None = None) -> str:
    """Write checkpoint ``step``: the state's leaves, what makes a resume exact, and
    ``meta`` (the run's identity; the digest, update and format are added here)."""
    import jax
    import orbax.checkpoint as ocp

    resume = resume or {}
    rollouts = rollouts or []
    resume_leaves, resume_tree = jax.tree.flatten(resume)
    tree: dict[str, Any] = {"state": _numbered(state)}
    if resume_leaves:
        tree["resume"] = _numbered(resume_leaves)
    if rollouts:
        tree["rollouts"] = _numbered([np.frombuffer(b, np.uint8) for b in rollouts])
    record = {
        **meta,
        "format": FORMAT,
        "step": int(step),
        "resume_keys": _resume_layout(resume, resume_tree),
        "digest": digest_of(state, resume_leaves, rollouts),
    }
    with _manager(directory, create=True) as manager:
        if step in manager.all_steps():
            # Only a step that restore() passed over comes back here: one a lost attempt
            # left without its record (a host lost mid-save) or damaged. The resumed run's
            # own step replaces it.
            manager.delete(step)
        manager.save(step, args=ocp.args.PyTreeSave(tree), force=True)
        manager.wait_until_finished()
    folder = Path(directory, str(step))
    # Written last, under a temporary name: a step without it is not a checkpoint.
    partial = folder / f".{META}.partial"
    partial.write_text(json.dumps(record, indent=1, default=str))
    os.replace(partial, folder / META)
    return str(folder)


def _resume_layout(resume: dict, treedef) -> dict:
    """How to rebuild the resume pytree: its top-level keys and leaf counts, in order."""
    import jax

    return {key: len(jax.tree.leaves(resume[key])) for key in sorted(resume)}


def restore(directory: str, step: int | None = None) -> Restored:
    """The newest checkpoint of ``directory`` that checks out (or exactly ``step``).

    A step whose files cannot be read or whose digest does not match is skipped, with a
    warning, for the one before it.

    Raises:
        CheckpointError: the directory does not exist, holds no checkpoint, or none of its
            checkpoints checks out.
    """
    require_checkpoint(directory)
    candidates = [step] if step is not None else steps(directory)
    problems = []
    for candidate in candidates:
        try:
            return _restore_step(directory, candidate)
        except CheckpointError as error:
            problems.append(f"step {candidate}: {error}")
            log.warning("checkpoint step %s of %s is unusable (%s); trying an older one",
                        candidate, directory, error)
    raise CheckpointError(
        f"No checkpoint in {directory!r} checks out: {'; '.join(problems)}. Start fresh in "
        "another checkpoint_dir."
    )


def _restore_step(directory: str, step: int) -> Restored:
    import orbax.checkpoint as ocp

    meta = read_meta(directory, step)
    if meta is None:
        raise CheckpointError(f"its {META} is missing or unreadable")
    try:
        with _manager(directory, create=False) as manager:
            tree = manager.restore(step, args=ocp.args.PyTreeRestore())
    except Exception as error:  # orbax raises many kinds for a damaged folder
        raise CheckpointError(f"orbax could not read it ({type(error).__name__})") from None
    state = [np.asarray(x) for x in _unnumbered(tree["state"])]
    resume_leaves = [np.asarray(x) for x in _unnumbered(tree.get("resume", {}))]
    blobs = [np.asarray(x).tobytes() for x in _unnumbered(tree.get("rollouts", {}))]
    if digest_of(state, resume_leaves, blobs) != meta.get("digest"):
        raise CheckpointError("its digest does not match what it holds")
    if blobs and not is_remote(directory):
        check_private(Path(directory))
    resume: dict = {}
    offset = 0
    for key, count in meta.get("resume_keys", {}).items():
        resume[key] = resume_leaves[offset:offset + count]
        offset += count
    return Restored(step, str(Path(directory, str(step))), meta, state, resume, blobs)
