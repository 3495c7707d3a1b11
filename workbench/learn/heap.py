"""Give memory that a process has freed back to the operating system."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def release_freed_memory() -> bool:
    """Return the heap pages this process has freed to the OS; True if it could.

    XLA's compiler allocates hundreds of MiB from many threads while it builds a program
    and frees them afterwards, but glibc keeps freed pages in its per-thread arenas. A
    learner that compiled its update held ~150 MiB it no longer used until this was called
    (measured on the CPU backend). A no-op where the C library is not glibc.
    """
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return False
    trim(0)
    return True
