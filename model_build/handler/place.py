"""The placing function, ``place_step``: the build state machine's Finish task, under the placing
role (the one that writes ``served/`` and ``_releases/``; ``is_complete`` under the same role
then writes ``_routes/``).

The build steps (:mod:`model_build.handler.build_steps`) parse model sources, so they run under
another role, which writes only ``_builds/``, ``_plans/`` and ``_jobs/``. What they stored is
their word: a build whose parser was subverted could have stored any bytes with an index that
says anything. So before a stored tarball is placed, this step (:func:`admit_stored`):

1. reads the tarball itself and computes its SHA-256 and size, which must be the ones the
   release places it under (the store index's digest, which names the served object);
2. admits those bytes (:func:`model_build.artifact.admission.check_admitted`): the pre-publish
   gate again without loading any model file (the placing role parses no graph the build role
   wrote: ``torch.jit.load`` and ``onnx.load`` run in the build's gate, under the build role), and
   the tarball tied to its manifest entry: the backend the entry's format is served by, a python
   backend only in a raw-text entry's tokenizer folder, whose ``model.py`` must be the project's
   (:data:`TOKENIZER_MODEL_SHA256`, fixed here) and whose ``tokenizers`` files must be the pinned
   wheel's (``serving-wheels.txt``), and no native library or path-valued option anywhere;
3. leaves the copy to :func:`model_build.release.store.assemble_release`, whose copy must come
   back with S3's own SHA-256 checksum of the copied bytes equal to that digest: the bytes placed
   are the bytes gated, even if the store were written again between the read and the copy.

Only objects not yet in the served prefix are read (an unchanged model costs nothing), several
at once within a disk budget, and the store index may name only its own key's tarball
(``assemble_release``). The Finish task is one Lambda run (15 minutes): a first release of many
new models reads all their tarballs there.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from triton_mme_cdk.model_build.errors import ModelBuildError, PublishError
from triton_mme_cdk.model_build.handler.build_steps import item_model, item_request, record_failure
from triton_mme_cdk.model_build.handler.request import (
    LOG,
    HandlerError,
    load_manifest,
    s3_client,
    short_error,
)
from triton_mme_cdk.model_build.handler.units import computed_release, write_index
from triton_mme_cdk.model_build.manifest import ModelSpec
from triton_mme_cdk.model_build.text_ensemble.serving_wheel import pinned_file_digests

if TYPE_CHECKING:  # the admission imports the gate (onnx, tritonclient): not at synth
    from triton_mme_cdk.model_build.artifact.admission import PythonModelRule

#: Bytes read at a time from a stored tarball.
READ_BLOCK = 1024 * 1024
#: Stored tarballs read and gated at once, and the bytes they may hold on disk together.
ADMIT_WORKERS = 8
ADMIT_DISK_BUDGET = 4 * 1024**3
#: SHA-256 of the project's tokenizer model (``model_build/text_ensemble/tokenizer_model.py``),
#: the one python-backend ``model.py`` a placed tarball may hold. Fixed here, not read from a
#: file the build could change; ``tests/test_placing_gate.py`` checks that it is the file's.
TOKENIZER_MODEL_SHA256 = "8fc185e676bebb35db3e06051ae10234a3750287510d9b39fe14d46ebf8281d4"


def place_step(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """The placing function's one entry point, for the state machine: ``Step`` is ``place`` (a
    Map item after its build: that model's stored tarball checked again and placed) or
    ``finish`` (the release assembled, anything not placed yet checked first, its index written)."""
    steps = {"place": place_item, "finish": finish_release}
    step = event.get("Step")
    if step not in steps:
        raise HandlerError(f"field Step: got {step!r}; expected place or finish (the build steps run in build_step)")
    return steps[str(step)](event, context)


def place_item(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """One Map item after its build: ``{"Request", "Model", "Key"}``; the model's stored tarball
    admitted (:func:`admit_stored`) and copied under its served names, so that the checks of a
    release's new models run in parallel like their builds (Finish then finds them placed)."""
    LOG.info("place_item %s %s", event.get("Model"), event.get("Key"))
    try:
        from triton_mme_cdk.model_build.release.store import StoredModel, place_stored

        request = item_request(event)
        s3 = s3_client()
        spec, key = item_model(event, load_manifest(s3, request))
        try:
            copied = place_stored(s3, request.model_bucket, request.model_prefix,
                                  StoredModel(spec.name, key, tuple(spec.target_names()), spec.format),
                                  admit=lambda objects: admit_stored(s3, request.model_bucket, objects,
                                                                     {spec.name: spec}))
        except Exception as error:
            record_failure(s3, request, spec.name, error)  # the Map's own failure names no model
            raise
        return {"Model": spec.name, "Key": key, "Placed": copied}
    except (HandlerError, ModelBuildError) as error:
        raise short_error(error) from None


def finish_release(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """The final step: ``{"Request": <resource properties>}``; assembles the release from the
    store, each tarball it places admitted first (:func:`admit_stored`), and writes its index. A
    model not stored fails it, naming the model."""
    LOG.info("finish_release")
    try:
        request = item_request(event)
        s3 = s3_client()
        manifest = load_manifest(s3, request)
        write_index(s3, request, manifest, computed_release(manifest),
                    admit=lambda objects: admit_stored(s3, request.model_bucket, objects,
                                                       {spec.name: spec for spec in manifest.models}))
        return request.data(manifest.target_count)
    except (HandlerError, ModelBuildError) as error:
        raise short_error(error) from None


def tokenizer_rule() -> PythonModelRule:
    from triton_mme_cdk.model_build.artifact.admission import PythonModelRule

    """What a raw-text tarball's python-backend folder may hold: the project's ``model.py``
    (:data:`TOKENIZER_MODEL_SHA256`), the pinned wheel's files by their digests, ``tokenizer.json``."""
    code = {"model.py": TOKENIZER_MODEL_SHA256}
    code.update({f"site-packages/{name}": digest for name, digest in pinned_file_digests().items()})
    return PythonModelRule(folder="tokenizer", version="1", code=code, data=frozenset({"tokenizer.json"}))


def admit_stored(s3: Any, bucket: str, objects: Sequence[Any], specs: Mapping[str, ModelSpec]) -> None:
    """Read each stored tarball the release is about to place (once per stored key), check its
    SHA-256 and size against the digest it is placed under, and admit it against its manifest
    entry (``specs``: model name -> entry; :func:`model_build.artifact.admission.check_admitted`).
    Raises a :class:`ModelBuildError` naming the model and the file; nothing is copied then.

    Several at once (:data:`ADMIT_WORKERS`), as long as the tarballs on disk together stay within
    :data:`ADMIT_DISK_BUDGET` (a larger one is read alone): the Lambda's ``/tmp`` holds 10 GB."""
    from concurrent.futures import ThreadPoolExecutor

    # Imported here, once, before the workers start (the gate's libraries are not a synth's).
    from triton_mme_cdk.model_build.artifact import admission

    unique = list({obj.source_key: obj for obj in objects if obj.source_key is not None}.values())
    if not unique:
        return
    for obj in unique:
        if obj.model not in specs:
            raise PublishError(f"stored tarball s3://{bucket}/{obj.source_key}: model {obj.model!r} is not an entry "
                               "of the manifest; nothing is placed", model=obj.model)
    rule = tokenizer_rule() if any(specs[obj.model].inputs == "text" for obj in unique) else None
    budget = _DiskBudget(ADMIT_DISK_BUDGET)
    with ThreadPoolExecutor(max_workers=ADMIT_WORKERS, thread_name_prefix="admit") as pool:
        for future in [pool.submit(_admit_one, admission.check_admitted, s3, bucket, obj, specs[obj.model], rule, budget) for obj in unique]:
            future.result()


def _admit_one(check_admitted: Any, s3: Any, bucket: str, obj: Any, spec: ModelSpec, rule: PythonModelRule | None,
                budget: _DiskBudget) -> None:
    with budget.hold(int(obj.size)):
        work = Path(tempfile.mkdtemp(prefix="place-", dir=os.environ.get("TMPDIR")))
        try:
            path = work / "model.tar.gz"
            sha256, size = _download(s3, bucket, obj.source_key, path, model=obj.model)
            if sha256 != obj.sha256 or size != obj.size:
                raise PublishError(
                    f"stored tarball s3://{bucket}/{obj.source_key} has sha256 {sha256[:16]}... and {size} bytes; "
                    f"its store index says {str(obj.sha256)[:16]}... and {obj.size} bytes: not placed",
                    model=obj.model)
            check_admitted(path, spec, python_rule=rule)
            LOG.info("admitted %s (%s, sha256 %s...)", obj.source_key, obj.model, sha256[:12])
        finally:
            shutil.rmtree(work, ignore_errors=True)


class _DiskBudget:
    """Bytes on disk at once: a hold waits until its bytes fit (one larger than all waits for none)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self._changed = threading.Condition()

    @contextmanager
    def hold(self, size: int) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: self.used == 0 or self.used + size <= self.limit)
            self.used += size
        try:
            yield
        finally:
            with self._changed:
                self.used -= size
                self._changed.notify_all()


def _download(s3: Any, bucket: str, key: str, path: Path, *, model: str) -> tuple[str, int]:
    """Write the object to ``path`` and return the SHA-256 (hex) and size of what was read."""
    from botocore.exceptions import BotoCoreError, ClientError

    from triton_mme_cdk.model_build.release.transfer import error_code

    digest, size = hashlib.sha256(), 0
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        with path.open("wb") as handle:
            while block := body.read(READ_BLOCK):
                digest.update(block)
                handle.write(block)
                size += len(block)
    except (ClientError, BotoCoreError) as error:
        raise PublishError(f"reading the stored tarball s3://{bucket}/{key} failed: {error_code(error)}",
                           model=model) from None
    return digest.hexdigest(), size
