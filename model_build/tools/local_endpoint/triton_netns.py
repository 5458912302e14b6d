"""``tritonserver`` in a network namespace of its own, reached through a Unix socket.

Triton 2.51 binds its SageMaker port on every interface and has no address option for it. Where
the host lets an unprivileged user create namespaces (``unshare --user --map-root-user --net``:
a user namespace that owns a new network namespace), the server starts inside one whose only
interface is its own loopback: no other machine, and no other process's network, can reach the
port. The local endpoint reaches it through a Unix socket in its work folder (a file: seen across
network namespaces, and only by who may open the folder), which :func:`main`, run inside the
namespace beside the server, forwards to the server's port there.

Where the host refuses such a namespace (:func:`available` is false: a container without user
namespaces, ``kernel.unprivileged_userns_clone=0``, no ``unshare``), the server runs as before,
its port open on every interface of the machine; the local endpoint says so in its ready line
(docs/local-endpoint.md).

This file is run by path, as a script, inside the namespace: it imports the standard library only.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
from contextlib import suppress
from pathlib import Path

#: ``ioctl`` requests and the flag that bring an interface up (linux/sockios.h, linux/if.h).
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
#: ``prctl(PR_SET_PDEATHSIG, ...)``: the server gets SIGTERM when this forwarder dies.
_PR_SET_PDEATHSIG = 1
_UNSHARE = ("unshare", "--user", "--map-root-user", "--net", "--")


@functools.cache
def available() -> bool:
    """Whether this host lets this user start a process in a new network namespace (tried once)."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return False
    try:
        done = subprocess.run([*_UNSHARE, "true"], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def command(server: list[str], socket_path: Path, port: int) -> list[str]:
    """``server`` started in a new network namespace, behind a forwarder from ``socket_path``."""
    return [*_UNSHARE, sys.executable, "-S", str(Path(__file__).resolve()), str(socket_path), str(port), "--", *server]


def _loopback_up() -> None:
    """Bring up ``lo`` of the new namespace (down when the namespace is made)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | _IFF_UP, b""))


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with suppress(OSError):
        while data := source.recv(1 << 16):
            sink.sendall(data)
    with suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _bridge(client: socket.socket, port: int) -> None:
    """One connection: the Unix socket's client to the server's port, both ways, until both end."""
    with client:
        try:
            upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            return  # not listening yet: the client sees the connection close, and retries
        with upstream:
            upstream.settimeout(None)
            # A request that reaches the Unix socket in two reads (headers, then body) leaves here as
            # two writes; with Nagle's algorithm the second waits for the server's delayed ACK (40 ms).
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
            back.start()
            _pump(client, upstream)
            back.join()


def _serve(listener: socket.socket, port: int) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_bridge, args=(client, port), daemon=True).start()


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        os._exit(111)


def main(argv: list[str]) -> int:
    """``<socket path> <port> -- <server command...>``, inside the namespace: bring up loopback,
    start the server (it inherits stdout and stderr: the log), forward the socket to its port, and
    exit with its status. SIGTERM and SIGINT are passed on to the server."""
    socket_path, port, separator, *server = argv
    if separator != "--" or not server:
        print("usage: triton_netns.py <socket> <port> -- <command...>", file=sys.stderr)
        return 2
    _loopback_up()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    os.chmod(socket_path, 0o600)
    listener.listen(128)
    process = subprocess.Popen(server, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)

    def pass_on(signum: int, _frame: object) -> None:
        if process.poll() is None:
            process.send_signal(signum)

    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGINT, pass_on)
    threading.Thread(target=_serve, args=(listener, int(port)), daemon=True).start()
    status = process.wait()
    listener.close()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
