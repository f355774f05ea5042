"""The listening socket: accepted connections have TCP_NODELAY (small responses on a keep-alive
connection are not held back by Nagle's algorithm waiting for the client's delayed ACK), and a port
that cannot be had is a one-line error and exit 1, not uvicorn's log line or a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ortserve.server.cli import listening_socket

FAKE_SERVER = Path(__file__).parent / "fake_server.py"


def test_accepted_sockets_inherit_tcp_nodelay():
    sock = listening_socket("127.0.0.1", 0, 16)
    try:
        client = socket.create_connection(sock.getsockname()[:2])
        accepted, _ = sock.accept()
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        accepted.close()
        client.close()
    finally:
        sock.close()


def serve(tokenizer_dir: Path, *flags: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(FAKE_SERVER), str(tokenizer_dir), *flags]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=FAKE_SERVER.parent)


def test_a_port_in_use_is_a_one_line_error(tokenizer_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = serve(tokenizer_dir, "--port", str(port))
    assert done.returncode == 1
    assert f"ortserve: error: cannot listen on 127.0.0.1:{port}: Address already in use" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


@pytest.mark.parametrize(
    "flags, status, says",
    [
        (("--port", "70000"), 2, "argument --port: 70000 is out of range: give a value from 0 to 65535"),
        (("--host", "999.1.1.1", "--port", "0"), 1, "ortserve: error: cannot listen on 999.1.1.1:0: "),
        (("--max-request-body-bytes", "0"), 2, "--max-request-body-bytes: 0 is out of range: give a value at least"),
        (("--drain-timeout", "-1"), 2, "argument --drain-timeout: -1 is out of range: give a value at least 0"),
        (("--max-waiting-requests", "x"), 2, "argument --max-waiting-requests: 'x' is not an integer"),
    ],
)
def test_an_address_or_a_setting_that_cannot_be_had_is_named(tokenizer_dir, flags, status, says):
    done = serve(tokenizer_dir, *flags)
    assert done.returncode == status and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
