"""The client distribution without an endpoint (issue 61): its codec against tritonclient's own,
its signature checks, its configuration errors, and its routes reads against moto's S3 server.

The endpoint side (every default target through the real tritonserver, a publish under load,
real 507s, injected throttling) is tests/test_client_endpoint.py.
"""

from __future__ import annotations

import json
import re
import struct
import threading
import uuid
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from s3_faults import FaultProxy, Rule  # tests/ is on sys.path

from triton_mme_cdk.model_build.aws_clients import make_s3_client
from triton_mme_client import (
    ConfigurationError,
    InvalidInput,
    ModelNotFound,
    RouteResolver,
    RoutesError,
    TritonMmeClient,
)
from triton_mme_client.codec import decode, encode_binary, encode_json, header_length
from triton_mme_client.routes import ROUTES_SCHEMA, served_name
from triton_mme_client.signatures import Signature, TensorSpec, check_inputs, parse_signature

RNG = np.random.default_rng(0)
ARRAYS = {
    "BOOL": np.array([[True, False, True]]),
    "UINT8": RNG.integers(0, 255, (2, 3), dtype=np.uint8),
    "INT8": RNG.integers(-100, 100, (2, 3), dtype=np.int8),
    "INT16": RNG.integers(-3000, 3000, (1, 4), dtype=np.int16),
    "UINT32": RNG.integers(0, 2**31, (3,), dtype=np.uint32),
    "INT32": RNG.integers(-(2**30), 2**30, (2, 2), dtype=np.int32),
    "INT64": RNG.integers(-(2**60), 2**60, (2, 5), dtype=np.int64),
    "UINT64": np.array([[2**63 + 5]], dtype=np.uint64),
    "FP16": RNG.standard_normal((2, 3)).astype(np.float16),
    "FP32": RNG.standard_normal((2, 3, 4)).astype(np.float32),
    "FP64": RNG.standard_normal((1, 2)),
    "BYTES": np.array([["first text"], ["sécond, with ünïcode"]], dtype=object),
}


def _tritonclient_body(arrays: dict[str, np.ndarray], *, binary: bool) -> tuple[bytes, int | None]:
    inputs = []
    for name, array in arrays.items():
        datatype = name if name in ARRAYS else "FP32"
        tensor = httpclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs)
    return body, json_size


@pytest.mark.parametrize("datatype", sorted(ARRAYS))
def test_a_binary_request_carries_the_same_tensor_bytes_as_tritonclients(datatype: str) -> None:
    array = ARRAYS[datatype]
    ours, content_type = encode_binary({datatype: array})
    theirs, json_size = _tritonclient_body({datatype: array}, binary=True)
    size = header_length(content_type)
    assert size is not None and json_size is not None
    assert content_type == f"application/vnd.sagemaker-triton.binary+json;json-header-size={size}"
    assert ours[size:] == theirs[json_size:], "the raw tensor section is byte-identical"
    ours_head, theirs_head = json.loads(ours[:size]), json.loads(theirs[:json_size])
    assert ours_head["inputs"] == theirs_head["inputs"]


@pytest.mark.parametrize("datatype", sorted(set(ARRAYS) - {"FP16"}))  # tritonclient sends FP16 as binary only
def test_a_json_request_carries_the_same_values_as_tritonclients(datatype: str) -> None:
    array = ARRAYS[datatype]
    ours, content_type = encode_json({datatype: array})
    theirs, _ = _tritonclient_body({datatype: array}, binary=False)
    assert content_type == "application/json"
    mine, other = json.loads(ours)["inputs"][0], json.loads(theirs)["inputs"][0]
    assert (mine["name"], mine["shape"], mine["datatype"]) == (other["name"], other["shape"], other["datatype"])
    assert mine["data"] == other["data"]


def _answer(arrays: dict[str, np.ndarray], *, binary: bool) -> tuple[bytes, str]:
    """An inference answer holding ``arrays`` as outputs, written from the request our encoder makes
    (the same layout: Triton's answer names ``outputs`` where the request names ``inputs``)."""
    body, content_type = (encode_binary if binary else encode_json)(arrays)
    size = header_length(content_type)
    head = json.loads(body[:size] if size else body)
    outputs = []
    for item in head["inputs"]:
        item = dict(item)
        if binary:
            item["parameters"] = {"binary_data_size": item["parameters"]["binary_data_size"]}
        outputs.append(item)
    text = json.dumps({"model_name": "m", "model_version": "1", "outputs": outputs}).encode()
    rest = body[size:] if size else b""
    return text + rest, (f"application/vnd.sagemaker-triton.binary+json;json-header-size={len(text)}"
                         if binary else "application/json")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_an_answer_reads_as_tritonclient_reads_it(binary: bool) -> None:
    arrays = {name: array for name, array in ARRAYS.items() if binary or name != "FP16"}
    body, content_type = _answer(arrays, binary=binary)
    ours = decode(body, content_type)
    theirs = httpclient.InferenceServerClient.parse_response_body(body, header_length=header_length(content_type))
    assert sorted(ours) == sorted(arrays)
    for name, array in arrays.items():
        expected = theirs.as_numpy(name)
        assert ours[name].shape == array.shape == expected.shape, name
        if name == "BYTES":
            assert [item.decode() for item in ours[name].flat] == [str(item) for item in array.flat]
            assert list(ours[name].flat) == [v.encode() if isinstance(v, str) else v for v in expected.flat]
        else:
            assert ours[name].dtype == expected.dtype, name
            np.testing.assert_array_equal(ours[name], expected)
            np.testing.assert_array_equal(ours[name], array)


def _binary(header: dict[str, Any], rest: bytes, *, size: int | None = None) -> tuple[bytes, str]:
    text = json.dumps(header).encode()
    return text + rest, f"application/vnd.sagemaker-triton.binary+json;json-header-size={size or len(text)}"


def _output(datatype: str, shape: list[int], size: int) -> dict[str, Any]:
    return {"outputs": [{"name": "y", "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": size}}]}


@pytest.mark.parametrize(("body", "content_type", "message"), [
    (b"{}", "application/json", "no outputs"),
    (b"not json", "application/json", "does not parse"),
    (*_binary(_output("FP32", [2], 8), b"\0" * 8, size=999), "names a JSON header of 999 bytes"),
    (*_binary(_output("FP32", [2], 8), b"\0" * 4), "8 bytes named, 4 present"),
    (*_binary(_output("FP32", [3], 8), b"\0" * 8), "8 bytes for 3 FP32 values"),
    (*_binary(_output("BYTES", [1], 6), struct.pack("<I", 9) + b"ab"), "runs past"),
    (b'{"outputs": [{"name": "y", "datatype": "BF16", "shape": [1], "data": [1]}]}', "application/json", "BF16"),
])
def test_an_answer_that_is_not_an_inference_response_is_one_error(body: bytes, content_type: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode(body, content_type)


TEXT = Signature(8, (TensorSpec("TEXT", "BYTES", (1,)),), (TensorSpec("sentence_embedding", "FP32", (384,)),))
IDS = Signature(32, (TensorSpec("input_ids", "INT64", (-1,)), TensorSpec("attention_mask", "INT64", (-1,))),
                (TensorSpec("sentence_embedding", "FP32", (384,)),))
NO_BATCH = Signature(0, (TensorSpec("x", "INT32", (2, 3)),), (TensorSpec("y", "FP32", (2,)),))


@pytest.mark.parametrize(("signature", "inputs", "message"), [
    (IDS, {"input_ids": np.ones((1, 4), np.int64), "attention_mask": np.ones((1, 4), np.int64),
           "token_type_ids": np.ones((1, 4), np.int64)}, "input 'token_type_ids' is not one of its inputs"),
    (IDS, {"input_ids": np.ones((1, 4), np.int64)}, "input 'attention_mask' is missing"),
    (IDS, {"input_ids": np.ones(4, np.int64), "attention_mask": np.ones(4, np.int64)}, "rank 1 .*takes rank 2"),
    (IDS, {"input_ids": np.ones((33, 4), np.int64), "attention_mask": np.ones((33, 4), np.int64)}, "batch of 33"),
    (IDS, {"input_ids": np.ones((1, 4)), "attention_mask": np.ones((1, 4), np.int64)},
     r"dtype float64 does not convert to INT64 .*astype\(np.int64\)"),
    (TEXT, {"TEXT": np.ones((1, 1), np.float32)}, "dtype float32 does not convert to BYTES"),
    (TEXT, {"TEXT": np.array([["a", "b"]], dtype=object)}, r"shape \[1, 2\] \(dimension 0 is 2, expected 1\)"),
    (NO_BATCH, {"x": np.ones((2, 3), np.int64) * 2**40}, "dtype int64 does not convert to INT32 without losing"),
    (NO_BATCH, {"x": np.ones((2, 3), np.float64)}, "dtype float64 does not convert to INT32"),
])
def test_inputs_the_signature_refuses_are_one_error_naming_model_input_and_what_it_takes(
        signature: Signature, inputs: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(InvalidInput, match=message) as refused:
        check_inputs("m", "m-0123456789ab.tar.gz", signature, inputs)
    text = str(refused.value)
    assert text.startswith("model 'm': ") and "the model takes " in text and "\n" not in text
    assert refused.value.model == "m" and refused.value.target_model == "m-0123456789ab.tar.gz"


def test_lossless_conversions_are_made_and_nothing_else() -> None:
    converted = check_inputs("m", "t", NO_BATCH, {"x": np.arange(6, dtype=np.int64).reshape(2, 3)})
    assert converted["x"].dtype == np.int32 and converted["x"].tolist() == [[0, 1, 2], [3, 4, 5]]
    converted = check_inputs("m", "t", IDS, {"input_ids": np.ones((2, 7), np.int32), "attention_mask": [[1] * 7] * 2})
    assert converted["input_ids"].dtype == np.int64 and converted["attention_mask"].dtype == np.int64
    texts = check_inputs("m", "t", TEXT, {"TEXT": np.array([["x"], [b"y"]], dtype=object)})["TEXT"]
    assert texts.dtype == object and texts.shape == (2, 1)


@pytest.mark.parametrize(("value", "message"), [
    ({"max_batch_size": -1, "inputs": [], "outputs": []}, "max_batch_size -1"),
    ({"max_batch_size": 1, "inputs": [{"name": "x", "datatype": "FLOAT", "dims": [1]}], "outputs": []}, "'FLOAT'"),
    ({"max_batch_size": 1, "inputs": [{"name": "x", "datatype": "FP32", "dims": "1"}], "outputs": []}, "dims '1'"),
    ({"max_batch_size": 1, "inputs": {}, "outputs": []}, "inputs is dict"),
])
def test_a_malformed_signature_is_refused(value: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_signature(value)
    assert parse_signature(None) is None, "no signature: unknown, not an error"


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("environ", "message"), [
    ({}, "environment variable TRITON_MME_ENDPOINT_NAME is not set"),
    ({"TRITON_MME_ENDPOINT_NAME": "e"}, "environment variable TRITON_MME_ROUTES_URL is not set"),
    ({"TRITON_MME_ENDPOINT_NAME": "e", "TRITON_MME_ROUTES_URL": "https://b/k"}, "routes_url 'https://b/k'"),
    ({"TRITON_MME_ENDPOINT_NAME": "e", "TRITON_MME_ROUTES_URL": "s3://bucket/k", "TRITON_MME_REFRESH_SECONDS": "soon"},
     "TRITON_MME_REFRESH_SECONDS 'soon'"),
    ({"TRITON_MME_ENDPOINT_NAME": "e", "TRITON_MME_ROUTES_URL": "s3://bucket/k", "TRITON_MME_REFRESH_SECONDS": "-1"},
     "refresh_seconds -1.0"),
])
def test_from_env_without_its_variables_is_one_error_naming_the_variable(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        TritonMmeClient.from_env(environ, runtime=object(), s3=object())


def test_from_env_reads_the_variables_the_construct_sets() -> None:
    client = TritonMmeClient.from_env({"TRITON_MME_ENDPOINT_NAME": "platform-embeddings",
                                       "TRITON_MME_ROUTES_URL": "s3://models-bucket/embeddings/_routes/routes.json",
                                       "TRITON_MME_REFRESH_SECONDS": "5"}, runtime=object(), s3=object())
    assert client.endpoint_name == "platform-embeddings"
    assert client.resolver.url == "s3://models-bucket/embeddings/_routes/routes.json"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"wire": "grpc"}, "wire 'grpc'"), ({"max_attempts": 0}, "max_attempts 0"),
    ({"backoff_seconds": -1}, "backoff_seconds -1"), ({"routes_url": "s3://bucket/"}, "routes_url 's3://bucket/'"),
])
def test_bad_arguments_are_one_error_naming_them(kwargs: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {"routes_url": "s3://bucket/p/_routes/routes.json", "runtime": object(), "s3": object()}
    with pytest.raises(ConfigurationError, match=message):
        TritonMmeClient("e", **{**arguments, **kwargs})


# ---------------------------------------------------------------------------------------------
# The routes, read from moto's S3 server
# ---------------------------------------------------------------------------------------------

SHA = "ab" * 32


def _document(routes: dict[str, Any], **extra: Any) -> bytes:
    return json.dumps({"schema": ROUTES_SCHEMA, "release_id": "r-1", "model_data_url": "s3://b/p/served/",
                       "index_key": "p/_releases/r-1/_index.json", "routes": routes, **extra}).encode()


def _route(name: str, sha: str = SHA, **extra: Any) -> dict[str, Any]:
    return {"target_model": served_name(name, sha), "sha256": sha, "size": 1, "model_key": "k", "source_model": name,
            **extra}


@pytest.fixture
def s3_bucket(endpoint: str) -> tuple[Any, str]:
    s3 = make_s3_client(endpoint_url=endpoint)
    bucket = f"client-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    return s3, bucket


def test_routes_are_read_conditionally_at_most_once_per_refresh_seconds(s3_bucket: tuple[Any, str]) -> None:
    s3, bucket = s3_bucket
    s3.put_object(Bucket=bucket, Key="p/_routes/routes.json", Body=_document({"a": _route("a")}))
    now = [0.0]
    resolver = RouteResolver(s3, bucket, "p/_routes/routes.json", refresh_seconds=30, clock=lambda: now[0])
    for _ in range(100):
        assert resolver.target_model("a") == served_name("a", SHA)
    assert (resolver.reads, resolver.not_modified) == (1, 0)
    now[0] = 31.0
    assert resolver.target_model("a") == served_name("a", SHA)
    assert (resolver.reads, resolver.not_modified) == (1, 1), "unchanged: a 304"
    s3.put_object(Bucket=bucket, Key="p/_routes/routes.json", Body=_document({"a": _route("a", "cd" * 32)}))
    assert resolver.target_model("a") == served_name("a", SHA), "within refresh_seconds: the cached route"
    now[0] = 62.0
    assert resolver.target_model("a") == served_name("a", "cd" * 32)
    assert resolver.requests == 3


def test_concurrent_unknown_names_share_one_refresh(s3_bucket: tuple[Any, str], proxy: FaultProxy) -> None:
    s3, bucket = s3_bucket
    s3.put_object(Bucket=bucket, Key="p/_routes/routes.json", Body=_document({"a": _route("a")}))
    slow = make_s3_client(endpoint_url=proxy.url)
    resolver = RouteResolver(slow, bucket, "p/_routes/routes.json", refresh_seconds=3600, clock=lambda: 0.0)
    resolver.target_model("a")
    # The refresh takes a second: every caller asks while it is under way, and waits for it.
    proxy.add(Rule("delay", method="GET", path="routes.json", seconds=1.0))
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            resolver.target_model("missing")
        except ModelNotFound as error:
            errors.append(error)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(errors) == 8 and all("'missing': not routed in s3://" in str(e) for e in errors)
    assert resolver.requests == 2, "one read, then one shared refresh for eight callers"


@pytest.mark.parametrize(("body", "message"), [
    (b'{"schema": "triton-mme/routes/9"}', "schema 'triton-mme/routes/9'"),
    (b'{"schema": "triton-mme/routes/1", "routes": ', "truncated"),
    (_document({"a": {"target_model": "x"}}), "route 'a' lacks sha256"),
    (_document({"a": _route("a", signature={"max_batch_size": 1, "inputs": 3, "outputs": []})}), "route 'a': signature"),
])
def test_an_unreadable_or_foreign_routes_document_is_one_error_naming_it(
        s3_bucket: tuple[Any, str], body: bytes, message: str) -> None:
    s3, bucket = s3_bucket
    s3.put_object(Bucket=bucket, Key="p/_routes/routes.json", Body=body)
    client = TritonMmeClient("e", routes_url=f"s3://{bucket}/p/_routes/routes.json", runtime=_NoCalls(), s3=s3)
    with pytest.raises(RoutesError, match=message) as refused:
        client.infer("a", {"x": np.ones(1, np.float32)})
    assert f"s3://{bucket}/p/_routes/routes.json" in str(refused.value) and "\n" not in str(refused.value)


def test_a_route_whose_target_is_not_its_digests_name_is_never_called(s3_bucket: tuple[Any, str]) -> None:
    s3, bucket = s3_bucket
    forged = {**_route("a"), "target_model": served_name("b", SHA)}
    s3.put_object(Bucket=bucket, Key="p/_routes/routes.json", Body=_document({"a": forged, "b": _route("b")}))
    runtime = _NoCalls()
    client = TritonMmeClient("e", routes_url=f"s3://{bucket}/p/_routes/routes.json", runtime=runtime, s3=s3)
    with pytest.raises(RoutesError, match=re.escape("route 'a': target_model 'b-abababababab.tar.gz' is not")):
        client.infer("a", {"x": np.ones(1, np.float32)})
    assert client.target_model("b") == served_name("b", SHA), "the other routes still resolve"


def test_an_unknown_name_is_model_not_found_naming_it_and_the_document(s3_bucket: tuple[Any, str]) -> None:
    s3, bucket = s3_bucket
    s3.put_object(Bucket=bucket, Key="p/_routes/routes.json", Body=_document({"a": _route("a")}))
    client = TritonMmeClient("e", routes_url=f"s3://{bucket}/p/_routes/routes.json", runtime=_NoCalls(), s3=s3)
    assert client.target_model("a") == served_name("a", SHA) and client.resolver.requests == 1
    with pytest.raises(ModelNotFound) as missing:
        client.infer("nope", {"x": np.ones(1, np.float32)})
    assert str(missing.value) == (f"model 'nope': not routed in s3://{bucket}/p/_routes/routes.json (release r-1); "
                                  "routed: a")
    assert client.resolver.requests == 2, "the cached routes are read once more before it fails"


def test_a_missing_routes_document_says_so(s3_bucket: tuple[Any, str]) -> None:
    s3, bucket = s3_bucket
    client = TritonMmeClient("e", routes_url=f"s3://{bucket}/p/_routes/routes.json", runtime=_NoCalls(), s3=s3)
    with pytest.raises(RoutesError, match="missing; nothing is routed"):
        client.models()


def test_models_lists_each_name_with_its_tensors_or_unknown(s3_bucket: tuple[Any, str]) -> None:
    s3, bucket = s3_bucket
    s3.put_object(Bucket=bucket, Key="p/_routes/routes.json", Body=_document(
        {"old": _route("old"), "text": _route("text", "cd" * 32, format="onnx", signature=TEXT.as_json())}))
    client = TritonMmeClient("e", routes_url=f"s3://{bucket}/p/_routes/routes.json", runtime=_NoCalls(), s3=s3)
    models = client.models()
    assert sorted(models) == ["old", "text"]
    assert models["old"].inputs is None and models["old"].signature is None, "an older release: unknown"
    assert models["text"].inputs == (TensorSpec("TEXT", "BYTES", (1,)),)
    assert models["text"].target_model == served_name("text", "cd" * 32)
    with pytest.raises(InvalidInput, match="input 'text' is not one of its inputs"):
        client.infer("text", {"text": np.array([["a"]], dtype=object)})


class _NoCalls:
    """A runtime client that fails the test if the client calls the endpoint."""

    def invoke_endpoint(self, **kwargs: Any) -> Any:
        raise AssertionError(f"the endpoint was called: {kwargs.get('TargetModel')}")
