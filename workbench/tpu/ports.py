"""Free TCP ports, asked of the OS."""

from __future__ import annotations

import socket


def free_port(host: str) -> int:
    """A port on ``host`` that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
