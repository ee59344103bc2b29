"""Listening sockets for servers that are handed a socket (uvicorn ``sockets=[...]``).

asyncio sets ``TCP_NODELAY`` on an accepted connection only when the socket's ``proto`` is
``IPPROTO_TCP``; a socket made as ``socket.socket()`` has ``proto == 0``, and its accepted connections
inherit it. Without ``TCP_NODELAY``, Nagle's algorithm meets the peer's delayed ACK and every second
request on a kept-alive connection waits about 40 ms. So every listener here is made with the protocol
named.
"""

from __future__ import annotations

import socket

__all__ = ["listening_socket"]


def listening_socket(host: str = "127.0.0.1", port: int = 0, backlog: int = 1024) -> socket.socket:
    """A bound, listening TCP socket on ``host:port`` (``port=0``: a free one; read it back from the socket)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    return sock
