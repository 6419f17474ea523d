"""Free TCP ports for the servers the harness starts."""

from __future__ import annotations

import socket


def free_port(address: str = "127.0.0.1") -> int:
    """A port free on ``address`` now (the OS's pick; a server started right after takes it)."""
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]
