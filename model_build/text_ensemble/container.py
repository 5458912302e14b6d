"""What a raw-text ensemble needs of the Triton container's start-up (checked at synth).

Every ensemble tarball names its members ``tokenizer`` and ``model`` (copies of one tarball are
server-side copies, so the names cannot differ per copy). Two loaded ensembles keep their
members apart only with model namespacing: SageMaker's ``docker/sagemaker/serve`` starts Triton
with ``--model-namespacing=true`` unless ``SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING`` is set, and
then passes that variable's value as the flag (``--model-namespacing=<value>``: despite its name,
``true`` keeps namespacing on). Only the manifest is imported here: synth stays light.
"""

from __future__ import annotations

from collections.abc import Mapping

from triton_mme_cdk.model_build.manifest import Manifest

NAMESPACING_KEY = "SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING"


def namespacing_problem(manifest: Manifest, environment: Mapping[str, str],
                        setting: str = "mme:triton_environment") -> str | None:
    """The error when the container would run without namespacing and the manifest has ensembles."""
    value = environment.get(NAMESPACING_KEY)
    if value is None or value.strip().lower() == "true":
        return None
    texts = [spec.name for spec in manifest.models if spec.inputs == "text"]
    if not texts:
        return None
    return (
        f"{setting}: {NAMESPACING_KEY} got {value!r}, which starts Triton with "
        f"--model-namespacing={value}; the raw-text targets of {', '.join(repr(t) for t in texts)} are "
        "ensembles whose members are named 'tokenizer' and 'model' in every tarball and collide "
        "without namespacing: leave the key unset (or 'true')"
    )
