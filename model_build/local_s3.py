"""A real S3 endpoint on loopback (moto's server) and the one S3 client factory the build uses.

The demo and the tests publish through the same HTTP code path as production: boto3 talks to
moto's S3 server over a socket, so retries, checksums, multipart uploads and timeouts are the
real ones, not a patched client. ``make_s3_client`` is also what the CLI and the Lambda handler
use against AWS: retries are left to botocore (it already retries throttling, 5xx, timeouts and
dropped connections with backoff), so no code in this package loops around S3 calls by hand.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from model_build.errors import PublishError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client  # pragma: no cover  (types only, never installed)

LOOPBACK = "127.0.0.1"
#: Region given to a local endpoint when none is configured: moto accepts any, boto3 needs one.
LOCAL_REGION = "us-east-1"
#: Credentials for a local endpoint when the environment has none. moto does not check them;
#: they are set on that one client only, never in ``os.environ``.
_DUMMY_KEY = "testing"


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


def is_local_endpoint(endpoint_url: str | None) -> bool:
    """True for an endpoint on this machine (loopback), where dummy credentials are harmless."""
    if not endpoint_url:
        return False
    host = urlsplit(endpoint_url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_s3_client(
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    max_attempts: int = 10,
    retry_mode: Literal["standard", "adaptive"] = "standard",
    connect_timeout: float = 5.0,
    read_timeout: float = 60.0,
    max_pool_connections: int = 64,
) -> S3Client:
    """A boto3 S3 client whose retries, timeouts and connection pool suit parallel publishing.

    - Retries are botocore's (``standard``: exponential backoff with jitter on throttling such as
      503 SlowDown, on 500/502/503/504, on read/connect timeouts and on reset connections;
      ``adaptive`` also rate-limits the client after throttling). ``max_attempts`` counts the first
      try. Request bodies are rewound by botocore before each retry.
    - ``max_pool_connections`` must be at least the publish concurrency, or worker threads queue
      for a connection (urllib3's default of 10 silently caps parallelism).
    - With an ``endpoint_url`` (MinIO, moto, a VPC endpoint...) path-style addressing is used,
      since such endpoints rarely resolve ``<bucket>.<host>`` names.
    - For a loopback endpoint, when no credentials are configured, this client (and only this
      client) gets dummy credentials; the instance-metadata and container credential providers
      are skipped for it, since asking them costs seconds on a machine outside AWS.
    """
    # Imported here so that importing this module (e.g. for is_local_endpoint) stays cheap.
    import boto3
    import botocore.session
    from botocore.config import Config

    if max_attempts < 1:
        raise ValueError(f"max_attempts: got {max_attempts}; it counts the first try, so must be >= 1")
    local = is_local_endpoint(endpoint_url)
    core = botocore.session.get_session()
    credentials: dict[str, str] = {}
    if local:
        resolver = core.get_component("credential_provider")
        for provider in ("container-role", "iam-role"):
            resolver.remove(provider)  # a no-op when absent
        if core.get_credentials() is None:
            credentials = {"aws_access_key_id": _DUMMY_KEY, "aws_secret_access_key": _DUMMY_KEY}
    session = boto3.session.Session(botocore_session=core)
    region_name = region or session.region_name or (LOCAL_REGION if local else None)
    config = Config(
        # "total_max_attempts" counts the first try; botocore's "max_attempts" key counts retries only.
        retries={"mode": retry_mode, "total_max_attempts": max_attempts},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        max_pool_connections=max_pool_connections,
        s3={"addressing_style": "path"} if endpoint_url else None,
    )
    return session.client(
        "s3", endpoint_url=endpoint_url, region_name=region_name, config=config, **credentials
    )
