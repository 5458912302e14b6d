"""Shared memory a raw-text ensemble's python model moves per request (checked at synth).

Triton's python backend passes every tensor between the server and the model's stub process
through a shared-memory pool: ``shm-default-byte-size`` at start, grown by ``shm-growth-byte-size``
(the stack's ``mme:shm_default_byte_size`` / ``mme:shm_growth_byte_size``). A raw-text target's
tokenizer moves, for its largest batch, the strings in and the token ids out. The stack refuses a
default pool smaller than that, so the first full batch is not where a pool that cannot grow (a
small ``/dev/shm``) is found out. Only the manifest is imported here: synth stays light.

The pool's sizes are defined here, once: the endpoint construct's defaults
(``SageMakerHostingProps.shm_default_byte_size`` / ``shm_growth_byte_size``) and the local
``tritonserver``'s, where the app's ``cdk.json`` sets neither
(``model_build.tools.local_endpoint.triton_server.stack_shm_settings``).
"""

from __future__ import annotations

from triton_mme_cdk.model_build.manifest import PAIR_TASKS, Manifest, ModelSpec

#: ``SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE``: the pool each python-backend model starts with.
SHM_DEFAULT_BYTE_SIZE = 16 * 1024 * 1024
#: ``SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE``: the step it grows by.
SHM_GROWTH_BYTE_SIZE = 1024 * 1024
#: The largest size either setting takes (bytes, a signed 64-bit count).
SHM_MAX_BYTE_SIZE = 2**63 - 1
#: The app's settings (``cdk.json`` context, ``-c``) that set them.
SHM_DEFAULT_KEY = "mme:shm_default_byte_size"
SHM_GROWTH_KEY = "mme:shm_growth_byte_size"

#: Outputs of the tokenizer per position: input_ids, attention_mask, token_type_ids (int64 each).
ID_TENSORS = 3
ID_BYTES = 8
#: UTF-8 bytes budgeted per token of input text: a WordPiece token averages a few characters and
#: a character at most 4 bytes; 64 leaves room for long words and non-Latin scripts.
TEXT_BYTES_PER_TOKEN = 64
#: Per string: the 4-byte length prefix of Triton's BYTES serialization.
STRING_HEADER_BYTES = 4


def shm_bytes_per_request(spec: ModelSpec) -> int:
    """Bytes in and out of the tokenizer for ``spec``'s largest batch (0 for token inputs)."""
    if spec.inputs != "text":
        return 0
    batch = max(1, spec.max_batch_size)
    length = spec.text_inputs.max_sequence_length
    # A pair's two strings share the row's max_sequence_length tokens; each has its own header.
    per_row = 2 if spec.task in PAIR_TASKS else 1
    strings = batch * (per_row * STRING_HEADER_BYTES + length * TEXT_BYTES_PER_TOKEN)
    ids = batch * length * ID_TENSORS * ID_BYTES
    return strings + ids


def shm_problem(manifest: Manifest, shm_default_byte_size: int,
                setting: str = SHM_DEFAULT_KEY) -> str | None:
    """The error for the first ensemble whose largest request does not fit the pool, or None."""
    for spec in manifest.models:
        needed = shm_bytes_per_request(spec)
        if needed > shm_default_byte_size:
            return (
                f"{setting}: got {shm_default_byte_size} bytes, but model {spec.name!r} (inputs: text, "
                f"max_batch_size {spec.max_batch_size} x max_sequence_length "
                f"{spec.text_inputs.max_sequence_length}) moves up to {needed} bytes per request through the "
                f"python backend's shared memory; set {setting} to at least {needed}, or lower the model's "
                "max_batch_size / text.max_sequence_length")
    return None
