"""Child processes a test starts (the command line's training runs) and watches."""

from __future__ import annotations

import os
import subprocess
import threading
import time


def watch_stderr(process: subprocess.Popen, lines: list[str]) -> threading.Thread:
    """Collect a child's stderr into ``lines`` as it comes, in a thread."""
    # Chunks, not lines: the progress bar redraws with carriage returns.
    def read() -> None:
        while chunk := os.read(process.stderr.fileno(), 4096):
            lines.append(chunk.decode(errors="replace"))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def start_until_progress(command: list[str], env: dict, timeout_s: float = 240.0):
    """Start a training command and wait until its progress bar shows a return (its first
    update is done); returns the process and its stderr so far (still growing)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, env=env)
    lines: list[str] = []
    watch_stderr(process, lines)
    deadline = time.monotonic() + timeout_s
    while not any("ret=" in line for line in lines):
        assert process.poll() is None, "".join(lines)
        assert time.monotonic() < deadline, "".join(lines)
        time.sleep(0.5)
    return process, lines
