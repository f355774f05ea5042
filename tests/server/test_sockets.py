"""Accepted connections have TCP_NODELAY: small responses on a keep-alive connection are not held
back by Nagle's algorithm waiting for the client's delayed ACK."""

from __future__ import annotations

import socket

import uvicorn

from ortserve.server.cli import listening_socket


def test_accepted_sockets_inherit_tcp_nodelay():
    sock = listening_socket(uvicorn.Config(app=None, host="127.0.0.1", port=0))
    try:
        client = socket.create_connection(sock.getsockname()[:2])
        accepted, _ = sock.accept()
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        accepted.close()
        client.close()
    finally:
        sock.close()
