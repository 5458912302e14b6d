"""What a smoke test needs before it invokes anything: the AWS clients, the release the endpoint
serves (``DescribeEndpoint`` -> ``DescribeEndpointConfig`` -> ``DescribeModel`` -> its model data
URL, then the routes or the index there: :func:`index_location`) and, per source model, the
request and the outputs to compare with (:class:`Reference`, from the reference ``.npz`` and the
Triton config recorded at build time: :func:`prepare_reference`; one that cannot be prepared
carries its ``error``, and every target of the model fails with it). :class:`CallFailed` is the
failure of one read here, and of one invocation or the check of its answer in
:mod:`model_build.tools.smoke.runner`.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from triton_mme_cdk.model_build.compare import config_served_precision, served_tolerance
from triton_mme_cdk.model_build.errors import ModelBuildError, TritonConfigError, VerifyError
from triton_mme_cdk.model_build.reference import read_reference
from triton_mme_cdk.model_build.release import INDEX_NAME, REFERENCE_DIR

#: Per-invocation limit; SageMaker itself gives a model 60 s to answer an invocation.
DEFAULT_TIMEOUT_SECONDS = 60.0
#: Endpoint states in which an invocation cannot be served at all.
_DEAD_STATES = frozenset({"Creating", "Failed", "Deleting", "OutOfService"})
#: A config.pbtxt larger than this inside a tarball is not a config.
_CONFIG_MAX_BYTES = 1 << 20
_MESSAGE_MAX = 200


class CallFailed(Exception):
    """One invocation (or the check of its answer) failed; carries the row's classification."""

    def __init__(
        self, kind: str, message: str, *, status: int | None = None, code: str | None = None,
        max_diff: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.code = code
        #: The largest difference measured before the check failed (values out of tolerance).
        self.max_diff = max_diff


@dataclass
class Reference:
    """What one source model's targets are sent and compared with (read once per source model)."""

    config: Any = None
    body: bytes = b""
    content_type: str = ""
    batch: int | None = None
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    #: Set when the reference could not be prepared: every target of the model fails with it.
    error: str | None = None
    #: False for a prebuilt TensorRT plan: its reference holds inputs only (no GPU at build time
    #: computed outputs), so names, data types and shapes are checked and no value is compared.
    values_checked: bool = True

    def tolerance(self, atol: float | None, rtol: float | None) -> tuple[float, float]:
        """The comparison's ``(atol, rtol)``: given ones, else the rule of the precision served."""
        rule_atol, rule_rtol = served_tolerance(config_served_precision(self.config) if self.config else None)
        return (rule_atol if atol is None else atol, rule_rtol if rtol is None else rtol)


# --------------------------------------------------------------------------------------------
# Clients
# --------------------------------------------------------------------------------------------


def make_client(
    service: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    read_timeout: float = DEFAULT_TIMEOUT_SECONDS,
    connect_timeout: float = 5.0,
    max_attempts: int = 3,
) -> Any:
    """A boto3 client for ``sagemaker``, ``sagemaker-runtime`` or ``s3`` with explicit timeouts.

    For a loopback ``endpoint_url`` (tests, local fakes) and no configured credentials, this client
    alone gets dummy credentials, by :func:`model_build.aws_clients.client_session`'s rule.
    """
    from botocore.config import Config
    from botocore.exceptions import NoRegionError

    from triton_mme_cdk.model_build.aws_clients import client_session, make_s3_client

    if service == "s3":
        return make_s3_client(endpoint_url=endpoint_url, region=region)
    session, credentials, region_name = client_session(endpoint_url, region)
    config = Config(
        retries={"mode": "standard", "total_max_attempts": max_attempts},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
    )
    try:
        return session.client(
            service,
            endpoint_url=endpoint_url,
            region_name=region_name,
            config=config,
            **credentials,
        )
    except NoRegionError:
        raise ModelBuildError(
            f"{service} client: no aws region configured; pass --region or set AWS_REGION", step="smoke"
        ) from None


def make_runtime_client(
    *, endpoint_url: str | None = None, region: str | None = None,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> Any:
    """A ``sagemaker-runtime`` client for smoke tests: read timeout = the limit, no retries.

    No retries because a retried invocation would hide what the smoke test measures: a cold load
    that times out would be retried against a now-warm model and look like a slow success.
    """
    return make_client(
        "sagemaker-runtime", endpoint_url=endpoint_url, region=region,
        read_timeout=timeout_seconds, max_attempts=1,
    )


# --------------------------------------------------------------------------------------------
# Finding the release
# --------------------------------------------------------------------------------------------


def smoke_error(message: str) -> ModelBuildError:
    """The error that stops a smoke test before any row (step ``smoke``): nothing to test."""
    return ModelBuildError(message, step="smoke")


def _control_plane(call: Callable[..., dict[str, Any]], what: str, endpoint: str, **kwargs: Any) -> dict[str, Any]:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return call(**kwargs)
    except ClientError as error:
        info = error.response.get("Error", {})
        message = one_line(str(info.get("Message", "")))
        raise smoke_error(f"endpoint {endpoint!r}: {what} failed: {info.get('Code', '?')}: {message}") from None
    except BotoCoreError as error:
        raise smoke_error(f"endpoint {endpoint!r}: {what} failed: {one_line(str(error))}") from None


def find_model_data_url(sagemaker_client: Any, endpoint_name: str) -> tuple[str, str]:
    """The model data URL of the endpoint's first production variant, and the endpoint status."""
    endpoint = _control_plane(
        sagemaker_client.describe_endpoint, "describe_endpoint", endpoint_name, EndpointName=endpoint_name
    )
    status = str(endpoint.get("EndpointStatus", "?"))
    if status in _DEAD_STATES:
        raise smoke_error(f"endpoint {endpoint_name!r}: status {status}; invocations need InService (or Updating)")
    config_name = endpoint.get("EndpointConfigName")
    if not config_name:
        raise smoke_error(f"endpoint {endpoint_name!r}: describe_endpoint gives no EndpointConfigName")
    config = _control_plane(
        sagemaker_client.describe_endpoint_config, f"describe_endpoint_config {config_name!r}",
        endpoint_name, EndpointConfigName=config_name,
    )
    variants = config.get("ProductionVariants") or []
    model_name = variants[0].get("ModelName") if variants else None
    if not model_name:
        raise smoke_error(
            f"endpoint {endpoint_name!r}: endpoint config {config_name!r} has no production variant "
            "with a ModelName"
        )
    model = _control_plane(
        sagemaker_client.describe_model, f"describe_model {model_name!r}", endpoint_name, ModelName=model_name
    )
    container: dict[str, Any] = model.get("PrimaryContainer") or next(iter(model.get("Containers") or []), {})
    url = container.get("ModelDataUrl") or (
        (container.get("ModelDataSource") or {}).get("S3DataSource") or {}
    ).get("S3Uri")
    if not url:
        raise smoke_error(
            f"endpoint {endpoint_name!r}: model {model_name!r} has no ModelDataUrl; a multi-model "
            "endpoint needs the s3 prefix of a release"
        )
    return str(url), status


def index_location(s3_client: Any, model_data_url: str, release: str | None) -> tuple[str, str, str]:
    """``(bucket, served prefix, index key)`` of what the endpoint serves.

    The fixed served prefix of a stack (``<prefix>/served/``): the routes document
    (``<prefix>/_routes/routes.json``) names the release routed now, whose index is in
    ``<prefix>/_releases/<id>/``; ``release`` picks another release's index there. A release
    prefix of the earlier layout holds its own index."""
    from triton_mme_cdk.model_build.release import SERVED_DIR, Release, routes_key
    from triton_mme_cdk.model_build.release.index import read_routes

    bucket, prefix = split_model_data_url(model_data_url)
    parent, _, last = prefix.rpartition("/")
    if last != SERVED_DIR:
        bucket, prefix = split_model_data_url(model_data_url, release=release)
        return bucket, prefix, f"{prefix}/{INDEX_NAME}" if prefix else INDEX_NAME
    if release is not None:
        split_model_data_url(model_data_url, release=release)  # the same check of the id
        return bucket, prefix, Release(release, "", "").index_key(parent)
    try:
        routes = read_routes(s3_client, bucket, parent)
    except ModelBuildError as error:
        raise smoke_error(str(error)) from None
    if routes is None:
        raise smoke_error(f"model data url {model_data_url}: no routes at s3://{bucket}/{routes_key(parent)}; "
                    "nothing has been published and routed there yet")
    return bucket, prefix, routes.index_key


def split_model_data_url(url: str, *, release: str | None = None) -> tuple[str, str]:
    """``(bucket, release prefix)`` of ``s3://bucket/prefix/release/``; ``release`` replaces the last part."""
    match = re.fullmatch(r"s3://([^/]+)/?(.*)", url)
    if not match:
        raise smoke_error(f"model data url {url!r}: not an s3:// url; a release lives at s3://<bucket>/<prefix>/<release>/")
    bucket, prefix = match.group(1), match.group(2).strip("/")
    if release is not None:
        if not release or "/" in release or release in {".", ".."}:
            raise smoke_error(f"release: got {release!r}; expected a release id such as r-0123456789abcdef")
        parent = prefix.rpartition("/")[0]
        prefix = f"{parent}/{release}" if parent else release
    return bucket, prefix


# --------------------------------------------------------------------------------------------
# References
# --------------------------------------------------------------------------------------------


def one_line(text: str, limit: int = _MESSAGE_MAX) -> str:
    """``text`` on one line (whitespace runs as one space), cut to ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _get_bytes(s3_client: Any, bucket: str, key: str, *, limit: int | None = None) -> bytes | None:
    """The object's bytes, or None when it does not exist; other S3 errors raise ``CallFailed``."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        response = s3_client.get_object(Bucket=bucket, Key=key)
        body = response["Body"]
        data: bytes = body.read(limit + 1) if limit is not None else body.read()
    except ClientError as error:
        code = str(error.response.get("Error", {}).get("Code", "?"))
        if code in {"NoSuchKey", "404", "NotFound"}:
            return None
        raise CallFailed("reference", f"s3://{bucket}/{key}: cannot be read: {code}") from None
    except BotoCoreError as error:
        raise CallFailed("reference", f"s3://{bucket}/{key}: cannot be read: {one_line(str(error))}") from None
    if limit is not None and len(data) > limit:
        raise CallFailed("reference", f"s3://{bucket}/{key}: larger than {limit} bytes")
    return data


def _config_from_tarball(s3_client: Any, bucket: str, key: str) -> str | None:
    """``config.pbtxt`` read from a published tarball without unpacking it to disk.

    The fallback for releases published before ``_reference/<model>.config.pbtxt`` existed; it
    streams the tarball, so it costs one download of the model.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    from triton_mme_cdk.model_build.artifact.tarball import read_member
    from triton_mme_cdk.model_build.errors import ModelBuildError

    try:
        body = s3_client.get_object(Bucket=bucket, Key=key)["Body"]
        with tempfile.NamedTemporaryFile(suffix=".tar.gz") as local:
            for chunk in iter(lambda: body.read(1 << 20), b""):
                local.write(chunk)
            local.flush()
            # model_build.artifact.tarball reads it under the bomb/size limits (a tarball from a bucket
            # other teams write is not trusted).
            data = read_member(Path(local.name), lambda p: p.name == "config.pbtxt" and len(p.parts) <= 2,
                               max_bytes=_CONFIG_MAX_BYTES)
        return data.decode("utf-8") if data is not None else None
    except (ClientError, BotoCoreError, ModelBuildError, OSError, UnicodeDecodeError):
        return None


def prepare_reference(
    s3_client: Any,
    bucket: str,
    prefix: str,
    source_model: str,
    first_entry: dict[str, Any],
    digests: dict[str, str],
    work_dir: Path,
    reference_keys: Mapping[str, str],
) -> Reference:
    """Read one source model's reference and config and build the request body its targets get.

    ``digests`` maps object keys to the sha256 the index records for them (its ``references``):
    a reference that changed after the release was published would make every verdict meaningless.
    """
    from triton_mme_cdk.model_build.artifact.triton_config import check_config, parse_config
    from triton_mme_cdk.model_build.tools.smoke.codec import SAGEMAKER_BINARY_CONTENT_TYPE, build_request

    # The index names where each reference is (the store); an index of the earlier layout had them
    # in the release's own _reference/ folder.
    npz_key = reference_keys.get(f"{source_model}.npz", f"{prefix}/{REFERENCE_DIR}/{source_model}.npz")
    config_key = reference_keys.get(f"{source_model}.config.pbtxt",
                                    f"{prefix}/{REFERENCE_DIR}/{source_model}.config.pbtxt")
    try:
        raw = _get_bytes(s3_client, bucket, npz_key)
        if raw is None:
            return Reference(error=f"reference s3://{bucket}/{npz_key}: missing")
        config_raw = _get_bytes(s3_client, bucket, config_key, limit=_CONFIG_MAX_BYTES)
    except CallFailed as failed:
        return Reference(error=str(failed))
    for key, data in ((npz_key, raw), (config_key, config_raw)):
        expected = digests.get(key)
        if data is not None and expected and hashlib.sha256(data).hexdigest() != expected:
            return Reference(error=f"reference s3://{bucket}/{key}: sha256 differs from the index")
    if config_raw is not None:
        config_text = config_raw.decode("utf-8", errors="replace")
    else:
        tar_key = str(first_entry.get("key") or f"{prefix}/{first_entry['target_model']}")
        found = _config_from_tarball(s3_client, bucket, tar_key)
        if found is None:
            return Reference(
                error=f"config s3://{bucket}/{config_key}: missing, and no config.pbtxt could be read "
                f"from s3://{bucket}/{tar_key}"
            )
        config_text = found
    try:
        # A raw-text target's reference config is its ensemble's (TEXT in, the model's outputs
        # out): only parsed, as its members were checked at build time.
        ensemble = parse_config(config_text, model=source_model).platform == "ensemble"
        config = (parse_config if ensemble else check_config)(config_text, model=source_model)
    except TritonConfigError as error:
        return Reference(error=str(error))

    npz_path = work_dir / f"{source_model}.npz"
    npz_path.write_bytes(raw)
    plan = config.platform == "tensorrt_plan"
    try:
        inputs, outputs = read_reference(npz_path, outputs_required=not plan)
    except VerifyError as error:
        return Reference(error=str(error))
    values_checked = bool(outputs) or not plan
    for kind, ios, arrays in (("input", config.input, inputs), ("output", config.output, outputs)):
        if kind == "output" and not values_checked:
            continue
        absent = [io_.name for io_ in ios if io_.name not in arrays]
        if absent:
            return Reference(error=f"reference of {source_model!r}: no '{kind}:{absent[0]}' array; "
                              f"it holds {', '.join(sorted(arrays))}")
    mbs = config.max_batch_size
    batch = None
    sent: dict[str, np.ndarray] = {}
    for io_ in config.input:
        array = inputs[io_.name]
        if mbs >= 1:
            array = array[:mbs]  # the reference may hold more rows than one request may carry
            batch = int(array.shape[0])
            if io_.HasField("reshape"):
                array = array.reshape([batch, *io_.dims])
        elif io_.HasField("reshape"):
            array = array.reshape(list(io_.dims))
        sent[io_.name] = array
    expected_out = {io_.name: outputs[io_.name][:batch] for io_ in config.output if io_.name in outputs}  # batch None: all rows
    try:
        body, header_length = build_request(config, sent)
    except VerifyError as error:
        return Reference(error=str(error))
    return Reference(
        config=config,
        body=body,
        content_type=SAGEMAKER_BINARY_CONTENT_TYPE.format(header_length),
        batch=batch,
        outputs=expected_out,
        values_checked=values_checked,
    )
