"""The smoke client's request codec: the client side of Triton's binary+JSON protocol.

``build_request`` / ``parse_response`` use tritonclient's own types
(``application/vnd.sagemaker-triton.binary+json;json-header-size=<n>``). A tool: nothing of the
build runtime imports it, so editing it changes no model key and no release. Whether a published
tarball loads and answers is checked on the real ``tritonserver`` (``model_build.tools``); the
pre-publish gate the build runs is ``model_build.artifact.gate``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import (
    InferenceServerException,
    np_to_triton_dtype,
    triton_to_np_dtype,
)

from triton_mme_cdk.model_build.artifact.triton_config import ModelConfig, wire_datatype
from triton_mme_cdk.model_build.errors import VerifyError

#: ``Content-Type`` of a binary request to the SageMaker Triton container.
SAGEMAKER_BINARY_CONTENT_TYPE = "application/vnd.sagemaker-triton.binary+json;json-header-size={}"



# --------------------------------------------------------------------------------------------
# Request and response codec (tritonclient on the client side, Triton's format on the server)
# --------------------------------------------------------------------------------------------


def _np_dtype(datatype: str) -> Any:
    dtype = triton_to_np_dtype(datatype)
    if dtype is None:
        raise VerifyError(f"datatype: got {datatype!r}; not a triton data type")
    return dtype


def build_request(
    config: ModelConfig, inputs: Mapping[str, np.ndarray], *, outputs: list[str] | None = None
) -> tuple[bytes, int]:
    """The HTTP request body a tritonclient user sends, and its JSON header length.

    Each config input is sent as binary data with the config's data type and the array's shape;
    every config output (or ``outputs``) is requested as binary data.
    """
    model = config.name or "?"
    infer_inputs = []
    for io in config.input:
        if io.name not in inputs and io.optional:  # e.g. TEXT_PAIR: a request of single texts
            continue
        if io.name not in inputs:
            raise VerifyError(
                f"model {model!r}: input {io.name!r}: no data given; the config expects inputs "
                + ", ".join(repr(i.name) for i in config.input),
                model=model,
            )
        array = np.asarray(inputs[io.name])
        datatype = wire_datatype(io.data_type)
        if datatype != "BYTES" and np_to_triton_dtype(array.dtype) != datatype:
            raise VerifyError(
                f"model {model!r}: input {io.name!r}: data has dtype {array.dtype.name!r} "
                f"({np_to_triton_dtype(array.dtype)}); the config expects {datatype}",
                model=model,
            )
        infer_input = httpclient.InferInput(io.name, list(array.shape), datatype)
        try:
            infer_input.set_data_from_numpy(array, binary_data=True)
        except InferenceServerException as error:
            raise VerifyError(f"model {model!r}: input {io.name!r}: {error}", model=model) from None
        infer_inputs.append(infer_input)
    names = outputs if outputs is not None else [o.name for o in config.output]
    requested = [httpclient.InferRequestedOutput(name, binary_data=True) for name in names]
    body, header_length = httpclient.InferenceServerClient.generate_request_body(
        infer_inputs, outputs=requested
    )
    if header_length is None:  # no binary section at all (a model without inputs)
        header_length = len(body)
    return bytes(body), int(header_length)


_HEADER_SIZE = re.compile(r"json-header-size\s*=\s*(\d+)", re.IGNORECASE)


def header_length(content_type: str) -> int | None:
    """The JSON header's length that a binary+JSON answer's ``Content-Type`` names (None: all JSON)."""
    match = _HEADER_SIZE.search(content_type)
    return int(match.group(1)) if match else None


def parse_response(body: bytes, header_length: int | None) -> httpclient.InferResult:
    """Read a response body with tritonclient's own parser (what a client application uses)."""
    return httpclient.InferResult.from_response_body(body, header_length=header_length)


