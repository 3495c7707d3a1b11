"""Compiled programs kept on disk for every process of a multi-process JAX group.

JAX's persistent compilation cache writes entries from process 0 only, and on the CPU its
key hashes each process's own view of the device topology, so the other learners of a
simulated slice found nothing and compiled the update again on every start (6-8 s each on
two cores, all at once). Here each process keeps its own compiled program, keyed by the
program's text and by who runs it, through JAX's public executable serialization.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections import OrderedDict

log = logging.getLogger(__name__)


def cache_root() -> str:
    """Where compiled programs are kept: ``WORKBENCH_JAX_CACHE`` or the user's cache."""
    return os.environ.get(
        "WORKBENCH_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "workbench-jax")
    )


def private_cache_root() -> str | None:
    """The compile cache's folder if it is this user's and nobody else can write it
    (created so), else None with a warning: the cache is then not used."""
    import stat

    root = cache_root()
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        info = os.stat(root)
    except OSError as error:
        log.warning("compile cache %s unusable (%s)", root, error)
        return None
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        log.warning(
            "not using the compile cache %s: others can write it (mode %s, owner %d), and "
            "what it holds would run as code; make it private (chmod 700) or set "
            "WORKBENCH_JAX_CACHE to a folder of yours", root, stat.filemode(info.st_mode),
            info.st_uid)
        return None
    return root


def program_key(program_text: str, process_index: int, process_count: int, runtime: str) -> str:
    """The file name of one process's compiled program.

    Args:
        program_text: the lowered program (shapes, shardings and donations included).
        process_index: this process's rank in the group: each rank keeps its own binary.
        process_count: the size of the group.
        runtime: versions and devices that change what the compiler emits.
    """
    digest = hashlib.sha256()
    for part in (program_text, f"{process_index}/{process_count}", runtime):
        digest.update(part.encode())
        digest.update(b"\0")
    return f"p{process_index}-of-{process_count}-{digest.hexdigest()[:40]}.bin"


def _runtime_description() -> str:
    import jax
    import jaxlib

    device = jax.local_devices()[0]
    return "|".join((
        jax.__version__, jaxlib.__version__, device.platform, device.device_kind,
        str(jax.local_device_count()), os.environ.get("XLA_FLAGS", ""),
    ))


def load_or_compile(lowered, directory: str | None = None):
    """A compiled program for ``lowered`` (a ``jax.stages.Lowered``): read from this
    process's cache when an earlier run compiled it, else compiled and saved.

    Process 0 (and a single process) relies on JAX's own persistent cache, which covers
    it; saving again what JAX read from its cache would also lose code: an executable
    loaded from a file does not carry everything needed to serialize it again.
    """
    import jax

    name = program_key(lowered.as_text(), jax.process_index(), jax.process_count(),
                       _runtime_description())
    # The pytree structures are part of what stays loaded: one program text can serve two
    # argument structures, and a loaded program accepts only the one it was lowered for
    # (a program read from disk takes them from ``lowered``).
    loaded = (name, str(lowered.in_tree), str(lowered.out_tree))
    compiled = _in_memory.get(loaded)
    if compiled is None:
        compiled = _load_or_compile(lowered, name, directory)
    _in_memory[loaded] = compiled
    _in_memory.move_to_end(loaded)
    while len(_in_memory) > IN_MEMORY_PROGRAMS:
        _in_memory.popitem(last=False)
    return compiled


IN_MEMORY_PROGRAMS = 8
"""Compiled programs a process keeps loaded: a learner kept warm between runs (or a
benchmark repeating a run in one process) gets its program without reading it again."""
_in_memory: OrderedDict = OrderedDict()


def _load_or_compile(lowered, name: str, directory: str | None):
    import jax
    from jax.experimental.serialize_executable import deserialize_and_load, serialize

    if jax.process_index() == 0:
        return lowered.compile()
    if directory is None:
        root = private_cache_root()
        if root is None:
            return lowered.compile()
        directory = os.path.join(root, "per-process")
    path = os.path.join(directory, name)
    if os.path.exists(path):
        try:
            with open(path, "rb") as saved:
                return deserialize_and_load(saved.read(), lowered.in_tree, lowered.out_tree)
        except Exception as error:  # a truncated or stale file: compile it afresh
            log.warning("compiled program %s could not be loaded (%s); compiling", name, error)
    compiled = lowered.compile()
    try:
        blob, _, _ = serialize(compiled)
    except (ValueError, NotImplementedError) as error:
        log.info("compiled program %s cannot be saved (%s)", name, error)
        return compiled
    os.makedirs(directory, mode=0o700, exist_ok=True)
    # Written under a temporary name and renamed, so a reader never sees half a file.
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".partial-")
    with os.fdopen(handle, "wb") as out:
        out.write(blob)
    os.replace(temporary, path)
    return compiled
