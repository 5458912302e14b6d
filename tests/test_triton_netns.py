"""The local ``tritonserver`` is reachable from this process only: its own network namespace.

Run for real: the forwarder (``model_build/tools/local_endpoint/triton_netns.py``) in a new user and network
namespace in front of a plain HTTP server, and the real ``tritonserver`` as the local endpoint
starts it. Where this host refuses an unprivileged network namespace the tests say so and skip;
the endpoint then runs the server as before (docs/local-endpoint.md).
"""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from triton_mme_cdk.model_build.tools.local_endpoint import triton_netns
from triton_mme_cdk.model_build.tools.local_endpoint.triton_server import (
    TritonServer,
    free_port,
    stop_process,
    triton_server,
)

needs_namespace = pytest.mark.skipif(
    not triton_netns.available(),
    reason="this host refuses an unprivileged network namespace (unshare --user --map-root-user --net)")


def _refused_on_the_host(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


@needs_namespace
def test_the_forwarder_serves_its_socket_and_the_port_is_not_on_the_host(tmp_path: Path) -> None:
    port = free_port()
    server = [sys.executable, "-m", "http.server", str(port), "--bind", "0.0.0.0", "--directory", str(tmp_path)]
    (tmp_path / "hello.txt").write_text("from inside the namespace\n")
    sock = tmp_path / "server.sock"
    log = (tmp_path / "log").open("wb")
    process = subprocess.Popen(triton_netns.command(server, sock, port), stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        client = TritonServer(process, port, tmp_path / "log", version="test", unix_socket=sock)
        deadline = time.monotonic() + 20
        while True:
            try:
                answer = client.request("GET", "/hello.txt", timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline and process.poll() is None, (tmp_path / "log").read_text()
                time.sleep(0.1)
        assert (answer.status, answer.body) == (200, b"from inside the namespace\n")
        assert client.isolated
        assert _refused_on_the_host(port), "the server's port answers in this machine's network"
        assert oct(sock.stat().st_mode & 0o777) == "0o600"
    finally:
        stop_process(process, grace=5)
        log.close()
    assert process.returncode is not None


@needs_namespace
def test_the_real_tritonserver_answers_its_socket_and_nothing_else(tmp_path: Path) -> None:
    with triton_server(work_dir=tmp_path) as server:
        assert server.isolated and server.unix_socket is not None
        assert server.request("GET", "/ping").status == 200
        assert _refused_on_the_host(server.port)
        with pytest.raises(OSError):  # nor on another address of this machine
            address = socket.gethostbyname(socket.gethostname())
            with socket.create_connection((address, server.port), timeout=2):
                pass
    assert not server.alive()


def test_without_isolation_the_server_is_on_the_hosts_loopback(tmp_path: Path) -> None:
    """The fallback (a host without namespaces): the port is this machine's, as before."""
    with triton_server(work_dir=tmp_path, isolate=False) as server:
        assert not server.isolated
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
            connection.sock = sock
            connection.request("GET", "/ping")
            assert connection.getresponse().status == 200
