"""A real S3 endpoint on loopback (moto's server), for the demo, the tests and the benchmarks.

The demo and the tests publish through the same HTTP code path as production: boto3 talks to
moto's S3 server over a socket, so retries, checksums, multipart uploads and timeouts are the
real ones, not a patched client. This is a tool (never in the Lambda image's runtime, never
hashed into a model key); the client factory the build uses is :mod:`model_build.aws_clients`.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from triton_mme_cdk.model_build.aws_clients import LOOPBACK
from triton_mme_cdk.model_build.errors import PublishError


@contextmanager
def local_s3(port: int = 0) -> Iterator[str]:
    """Run moto's S3 server on 127.0.0.1 for the duration of the block; yields its endpoint URL.

    ``port=0`` lets the kernel pick a free port, so parallel test runs never collide. The server's
    state lives in this process (moto's in-memory backends) and is shared by every server started
    in it: use distinct bucket names.
    """
    # Imported here: moto pulls in flask and werkzeug, which nothing else in the build needs.
    from moto.server import ThreadedMotoServer

    if port:
        _check_port_free(port)
    # werkzeug prints one line per request to stderr unless its logger is configured; a publish
    # of a few hundred objects would bury the build's own output. Leave a configured level alone.
    werkzeug_log = logging.getLogger("werkzeug")
    if werkzeug_log.level == logging.NOTSET:
        werkzeug_log.setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address=LOOPBACK, port=port, verbose=False)
    server.start()
    try:
        host, bound = server.get_host_and_port()
        yield f"http://{host}:{bound}"
    finally:
        server.stop()
        # stop() shuts the serve loop down but leaves the listening socket open; close it so a
        # long test session does not leak one socket per server.
        inner = getattr(server, "_server", None)
        if inner is not None:
            inner.server_close()


def _check_port_free(port: int) -> None:
    """Fail fast on a busy port: ThreadedMotoServer.start() would wait forever if its bind fails."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((LOOPBACK, port))
    except OSError as error:
        reason = "in use" if error.errno == errno.EADDRINUSE else error.strerror
        raise PublishError(f"local s3: port {port} on {LOOPBACK} is not available ({reason})") from None
    finally:
        probe.close()
