"""Compiled programs kept on disk for every process of a multi-process JAX group.

JAX's persistent compilation cache writes entries from process 0 only, and on the CPU its
key hashes each process's own view of the device topology, so the other learners of a
simulated slice found nothing and compiled the update again on every start (6-8 s each on
two cores, all at once). Here compiled programs are kept through JAX's public executable
serialization, keyed by the program's text: on the simulated slice one binary that rank 0
compiles and every rank loads, elsewhere one per rank.

``WORKBENCH_COMPILE_CACHE_PER_RANK=1`` in a process's environment makes it keep one binary
per rank on the simulated slice too: the path a real TPU slice takes, which the simulation
otherwise never runs. It is read each time a program is built, so every rank of a group
must have the same value: in a group whose ranks disagree, the ranks that expect a shared
binary wait up to ``SHARED_WAIT_S`` for one that rank 0 never announces, then compile.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

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


def program_key(program_text: str, process_index: int | None, process_count: int,
                runtime: str) -> str:
    """The file name of a compiled program.

    Args:
        program_text: the lowered program (shapes, shardings and donations included).
        process_index: the rank whose binary this is, or None for a binary every rank of
            the group loads (see :func:`load_or_compile`).
        process_count: the size of the group.
        runtime: versions and devices that change what the compiler emits.
    """
    owner = "all" if process_index is None else f"p{process_index}"
    digest = hashlib.sha256()
    for part in (program_text, f"{owner}/{process_count}", runtime):
        digest.update(part.encode())
        digest.update(b"\0")
    return f"{owner}-of-{process_count}-{digest.hexdigest()[:40]}.bin"


def _runtime_description() -> str:
    """What besides the program decides the binary the compiler emits, as one string."""
    import jax
    import jaxlib

    device = jax.local_devices()[0]
    return "|".join((
        jax.__version__, jaxlib.__version__, device.platform, device.device_kind,
        str(jax.local_device_count()), os.environ.get("XLA_FLAGS", ""),
        # On TPU the compiler is libtpu's, not jaxlib's: its build is in the backend's
        # platform version, and its flags come from LIBTPU_INIT_ARGS (JAX's own cache key
        # hashes both too).
        _platform_version(device.platform), os.environ.get("LIBTPU_INIT_ARGS", ""),
    ))


def _platform_version(platform: str) -> str:
    """The backend's own description of its build (libtpu's version on TPU)."""
    from jax.extend.backend import get_backend

    return get_backend(platform).platform_version


PER_RANK_ENV = "WORKBENCH_COMPILE_CACHE_PER_RANK"
"""Set (to anything but ``0``) to keep one binary per rank on the simulated slice too."""


def _one_binary_for_all_ranks() -> bool:
    """Whether the group's ranks share one compiled binary: a multi-process group on CPU,
    the simulated slice, whose processes all see one machine's cache folder.

    Its ranks lower the same program text, and a binary one rank compiled runs in another
    (the device assignment in it is the group's, not the process's): so rank 0 compiles
    and the others load, instead of every chip process compiling the same update at once
    on a few shared cores. Elsewhere (a TPU slice's hosts have a cache folder each) every
    rank keeps its own binary, and so does the simulated slice with
    ``WORKBENCH_COMPILE_CACHE_PER_RANK=1`` (see the module's docstring).
    """
    import jax

    if os.environ.get(PER_RANK_ENV, "") not in ("", "0"):
        return False
    return jax.process_count() > 1 and jax.local_devices()[0].platform == "cpu"


def load_or_compile(lowered, directory: str | None = None):
    """A compiled program for ``lowered`` (a ``jax.stages.Lowered``): read from the cache
    when an earlier run (or, on the simulated slice, rank 0 of this group) compiled it,
    else compiled and saved.

    A single process, and process 0 of a group whose ranks keep their own binaries, rely
    on JAX's own persistent cache, which covers them.
    """
    import jax

    shared = _one_binary_for_all_ranks()
    name = program_key(lowered.as_text(), None if shared else jax.process_index(),
                       jax.process_count(), _runtime_description())
    # The pytree structures are part of what stays loaded: one program text can serve two
    # argument structures, and a loaded program accepts only the one it was lowered for
    # (a program read from disk takes them from ``lowered``).
    loaded = (name, str(lowered.in_tree), str(lowered.out_tree))
    return kept_in_memory(_in_memory, loaded,
                          lambda: _load_or_compile(lowered, name, directory, shared),
                          IN_MEMORY_PROGRAMS)


def kept_in_memory(store: OrderedDict, key, make: Callable[[], Any], limit: int):
    """``store[key]``, made by ``make()`` when missing; ``store`` keeps the ``limit`` most
    recently used entries (a learner kept warm between runs finds its programs there)."""
    found = store.get(key)
    if found is None:
        found = make()
    store[key] = found
    store.move_to_end(key)
    while len(store) > limit:
        store.popitem(last=False)
    return found


IN_MEMORY_PROGRAMS = 8
"""Compiled programs a process keeps loaded: a learner kept warm between runs (or a
benchmark repeating a run in one process) gets its program without reading it again."""
_in_memory: OrderedDict = OrderedDict()

SHARED_WAIT_S = 600.0
"""How long the other ranks wait for rank 0's binary before compiling their own: the
driver's own bound on a compile (a rank 0 that dies fails the attempt sooner)."""


def _load_or_compile(lowered, name: str, directory: str | None, shared: bool):
    import jax

    if jax.process_count() == 1 or (jax.process_index() == 0 and not shared):
        return lowered.compile()
    if directory is None:
        root = private_cache_root()
        if root is None:
            return lowered.compile()
        directory = os.path.join(root, "programs")
    path = os.path.join(directory, name)
    if shared:
        return _shared_binary(lowered, path, name)
    compiled = _load(lowered, path)
    if compiled is None:
        compiled = lowered.compile()
        _save(compiled, path, name)
    return compiled


def _shared_binary(lowered, path: str, name: str):
    """Rank 0 loads or compiles and saves, then tells the group through jax.distributed's
    key-value store; the others load what it saved (or compile, if it could not)."""
    import jax
    from jax._src import distributed

    client = distributed.global_state.client
    ready = f"workbench/compiled/{name}"
    if jax.process_index() == 0:
        compiled = None
        try:
            compiled = _load(lowered, path)
            if compiled is None:
                compiled = _compile_afresh(lowered)
                _save(compiled, path, name)
        finally:
            # Said whatever happened, so that no rank waits for a binary that will not come.
            client.key_value_set(ready, "done", allow_overwrite=True)
        return compiled
    compiled = _load(lowered, path)
    if compiled is not None:
        return compiled
    try:
        client.blocking_key_value_get(ready, int(SHARED_WAIT_S * 1000))
    except Exception as error:  # a timeout: this rank compiles its own
        log.warning("rank 0's program %s did not come (%s); compiling", name, error)
    compiled = _load(lowered, path)
    return compiled if compiled is not None else lowered.compile()


def _compile_afresh(lowered):
    """Compile without JAX's persistent cache: an executable JAX read from its cache does
    not carry everything needed to serialize it again, and this one is shared."""
    import jax

    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        return lowered.compile()
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)


def _load(lowered, path: str):
    """The program saved at ``path``, or None when there is none or it cannot be loaded."""
    from jax.experimental.serialize_executable import deserialize_and_load

    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as saved:
            return deserialize_and_load(saved.read(), lowered.in_tree, lowered.out_tree)
    except Exception as error:  # a truncated or stale file: compiled afresh
        log.warning("compiled program %s could not be loaded (%s); compiling",
                    os.path.basename(path), error)
        return None


def _save(compiled, path: str, name: str) -> None:
    from jax.experimental.serialize_executable import serialize

    try:
        blob, _, _ = serialize(compiled)
    except (ValueError, NotImplementedError) as error:
        log.info("compiled program %s cannot be saved (%s)", name, error)
        return
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    # Written under a temporary name and renamed, so a reader never sees half a file.
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".partial-")
    with os.fdopen(handle, "wb") as out:
        out.write(blob)
    os.replace(temporary, path)
