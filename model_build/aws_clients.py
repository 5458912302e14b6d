"""The AWS clients the build uses: one S3 client factory for the CLI, the Lambda and the demo.

Retries are left to botocore (it already retries throttling, 5xx, timeouts and dropped
connections with backoff), so no code in this package loops around S3 calls by hand. Endpoints
on loopback (moto's server of :mod:`model_build.tools.local_s3`, the local SageMaker endpoint)
get the same clients with the credential rule of :func:`client_session`.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client  # pragma: no cover  (types only, never installed)

LOOPBACK = "127.0.0.1"
#: Region given to a local endpoint when none is configured: moto accepts any, boto3 needs one.
LOCAL_REGION = "us-east-1"
#: Credentials for a local endpoint when the environment has none. moto does not check them;
#: they are set on that one client only, never in ``os.environ``.
_DUMMY_KEY = "testing"


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


@lru_cache(maxsize=4)
def _data_loader(data_path: str | None) -> Any:
    """One botocore data loader per process (per ``AWS_DATA_PATH``), shared by every session.

    Each botocore session otherwise makes its own loader, and each loader parses the endpoint
    table and the S3 service model from JSON again: about 0.1 s of CPU per client, which a Lambda
    that makes a client per call and the tests (hundreds of clients) both paid. The loader holds
    only botocore's shipped data files, never credentials or settings, so sharing it changes no
    client's behaviour."""
    from botocore.loaders import create_loader

    return create_loader(data_path)


def client_session(endpoint_url: str | None, region: str | None) -> tuple[Any, dict[str, str], str | None]:
    """The boto3 session, explicit credentials and region for a client of ``endpoint_url``.

    The one rule every client of the project follows: for a loopback endpoint the
    instance-metadata and container credential providers are skipped (asking them costs seconds
    on a machine outside AWS) and, when no credentials are configured, that client alone gets
    dummy ones (never set in ``os.environ``); its region defaults to :data:`LOCAL_REGION`.
    """
    # Imported here so that importing this module (e.g. for is_local_endpoint) stays cheap.
    import boto3
    import botocore.session

    local = is_local_endpoint(endpoint_url)
    core = botocore.session.get_session()
    core.register_component("data_loader", _data_loader(core.get_config_variable("data_path")))
    credentials: dict[str, str] = {}
    if local:
        resolver = core.get_component("credential_provider")
        for provider in ("container-role", "iam-role"):
            resolver.remove(provider)  # a no-op when absent
        if core.get_credentials() is None:
            credentials = {"aws_access_key_id": _DUMMY_KEY, "aws_secret_access_key": _DUMMY_KEY}
    session = boto3.session.Session(botocore_session=core)
    return session, credentials, region or session.region_name or (LOCAL_REGION if local else None)


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
    from botocore.config import Config

    if max_attempts < 1:
        raise ValueError(f"max_attempts: got {max_attempts}; it counts the first try, so must be >= 1")
    session, credentials, region_name = client_session(endpoint_url, region)
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
