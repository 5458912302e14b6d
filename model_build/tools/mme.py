"""SageMaker's part of a multi-model endpoint, in front of the real ``tritonserver``.

On a SageMaker MME the platform, not Triton, maps ``TargetModel`` to an S3 key under the model
data URL, downloads and unpacks the tarball on first use into ``/opt/ml/models/<hash>/model``,
asks the container to load it (``POST /models``), routes invocations to ``/models/<hash>/invoke``,
and unloads least-recently-used models when memory runs short (a load answered 507 unloads one
and retries). This module plays that part against a published release:

- a target must be listed in the release index; its download is checked against the index's
  sha256 before anything is unpacked, and unpacked with the project's safe extraction;
- ``KIND_GPU`` instance groups become ``KIND_CPU`` in the local copy of each ``config.pbtxt``
  (the only change to the published bytes: this machine has no GPU);
- concurrent first calls for one target load it once; a failure answers that call and the ones
  waiting on it, and the next call tries again;
- the memory budget counts the **unpacked size** of each loaded model (what SageMaker also sizes
  its cache by on disk); the server's resident memory is not measured.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from model_build.errors import ModelBuildError
from model_build.tools.triton_server import TritonServer

#: How long one load may take before the call fails (a python stub that never starts hangs the load).
LOAD_TIMEOUT_SECONDS = 300.0
INVOKE_TIMEOUT_SECONDS = 600.0
_CHUNK = 1 << 20


class EndpointError(Exception):
    """A refusal, as SageMaker's runtime API answers it: status, error code, message."""

    def __init__(self, status: int, code: str, message: str, *, original_status: int | None = None,
                 original_message: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.original_status = original_status
        self.original_message = original_message


def validation_error(message: str) -> EndpointError:
    return EndpointError(400, "ValidationError", message)


def model_error(target: str, status: int, message: str, *, what: str = "from primary") -> EndpointError:
    """A container answer other than 200, relayed as SageMaker does: 424 ``ModelError``."""
    kind = "server" if status >= 500 else "client"
    return EndpointError(
        424, "ModelError",
        f"TargetModel {target!r}: received {kind} error ({status}) {what} with message \"{message}\"",
        original_status=status, original_message=message,
    )


@dataclass
class Entry:
    """One target of the release index."""

    target: str
    key: str
    sha256: str
    size: int


@dataclass
class Loaded:
    name: str
    directory: Path
    size: int
    in_flight: int = 0


@dataclass
class Release:
    """Where a release lives and what its index lists."""

    bucket: str
    prefix: str
    release_id: str
    entries: dict[str, Entry] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}/" if self.prefix else f"s3://{self.bucket}/"


def read_release(s3_client: Any, bucket: str, model_prefix: str, release_id: str) -> Release:
    """The release index as entries by target; a missing index is an error naming where it looked."""
    from model_build.publish import read_index
    from model_build.release import INDEX_NAME

    prefix = "/".join(part for part in (model_prefix.strip("/"), release_id) if part)
    index_key = f"{prefix}/{INDEX_NAME}"
    index = read_index(s3_client, bucket, index_key)
    if index is None:
        raise ModelBuildError(
            f"release {release_id}: no index at s3://{bucket}/{index_key}; "
            "publish it first (python -m model_build publish) or check --bucket/--prefix/--release"
        )
    release = Release(bucket=bucket, prefix=prefix, release_id=release_id)
    for item in index.get("models") or []:
        entry = Entry(str(item["target_model"]), str(item["key"]), str(item["sha256"]), int(item["size"]))
        release.entries[entry.target] = entry
    return release


def model_name_for(target: str) -> str:
    """The name the platform loads a target under (a hash of the target, as SageMaker does)."""
    return hashlib.sha256(target.encode()).hexdigest()[:32]


def localize_configs(model_root: Path) -> None:
    """``KIND_GPU`` -> ``KIND_CPU`` in every config of an unpacked tarball (this machine has no GPU)."""
    from tritonclient.grpc import model_config_pb2 as mc

    for path in model_root.glob("*/config.pbtxt"):
        config = mc.ModelConfig()
        text_format.Parse(path.read_text(), config)
        changed = False
        for group in config.instance_group:
            if group.kind == mc.ModelInstanceGroup.KIND_GPU:
                group.kind = mc.ModelInstanceGroup.KIND_CPU
                del group.gpus[:]
                changed = True
        if changed:
            path.write_text(text_format.MessageToString(config))


def _tree_size(path: Path) -> int:
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


def _server_message(body: bytes, name: str, target: str) -> str:
    """The server's error text, with the target in place of the hashed name it loaded it under."""
    try:
        document = json.loads(body)
    except ValueError:
        text = body.decode(errors="replace").strip()
    else:
        text = str(document["error"]) if isinstance(document, dict) and "error" in document else json.dumps(document)
    return re.sub(rf"'[^']*::{name}'|'{name}'", repr(target), text)


class ModelCache:
    """Targets loaded on the server, least recently used first."""

    def __init__(self, *, server: TritonServer, s3_client: Any, release: Release, root: Path,
                 memory_budget_bytes: int | None = None) -> None:
        self.server = server
        self.s3 = s3_client
        self.release = release
        self.root = root
        self.budget = memory_budget_bytes
        self._loaded: OrderedDict[str, Loaded] = OrderedDict()
        self._state = threading.Lock()
        self._target_locks: dict[str, threading.Lock] = {}
        self.loads = 0
        self.unloads = 0
        #: Invocations received per target (also the ones refused), for the stop line and tests.
        self.invocations: Counter[str] = Counter()

    # ---------------------------------------------------------------- public

    def invoke(self, target: str, body: bytes, content_type: str) -> tuple[int, str, bytes]:
        """Load ``target`` if needed and run one inference: (status 200, content type, body)."""
        with self._state:
            self.invocations[target] += 1
        loaded = self._acquire(target)
        try:
            headers = {"Content-Type": content_type} if content_type else {}
            answer = self.server.request("POST", f"/models/{loaded.name}/invoke", body, headers=headers,
                                         timeout=INVOKE_TIMEOUT_SECONDS)
        finally:
            with self._state:
                loaded.in_flight -= 1
        if answer.status != 200:
            raise model_error(target, answer.status, _server_message(answer.body, loaded.name, target))
        return 200, answer.headers.get("Content-Type", "application/json"), answer.body

    def loaded_targets(self) -> list[str]:
        with self._state:
            return list(self._loaded)

    def loaded_bytes(self) -> int:
        with self._state:
            return sum(item.size for item in self._loaded.values())

    # ---------------------------------------------------------------- loading

    def _acquire(self, target: str) -> Loaded:
        entry = self.release.entries.get(target)
        if entry is None:
            raise validation_error(
                f"TargetModel {target!r}: not in release {self.release.release_id} "
                f"({self.release.url}); the release lists {len(self.release.entries)} targets"
            )
        with self._state:
            lock = self._target_locks.setdefault(target, threading.Lock())
        with lock:
            with self._state:
                loaded = self._loaded.get(target)
                if loaded is not None:
                    self._loaded.move_to_end(target)
                    loaded.in_flight += 1
                    return loaded
            loaded = self._load(entry)
            with self._state:
                self._loaded[target] = loaded
                loaded.in_flight += 1
                return loaded

    def _load(self, entry: Entry) -> Loaded:
        name = model_name_for(entry.target)
        directory = self.root / name / "model"
        shutil.rmtree(directory.parent, ignore_errors=True)
        directory.mkdir(parents=True)
        try:
            self._fetch(entry, directory)
            size = _tree_size(directory)
            self._make_room(entry.target, size)
            self._register(entry.target, name, directory, size)
        except BaseException:
            shutil.rmtree(directory.parent, ignore_errors=True)
            raise
        self.loads += 1
        return Loaded(name=name, directory=directory, size=size)

    def _fetch(self, entry: Entry, directory: Path) -> None:
        """Download, check the digest, unpack safely, localize the configs."""
        from botocore.exceptions import ClientError

        from model_build.tarball import safe_extract

        tarball = directory.parent / "model.tar.gz"
        digest = hashlib.sha256()
        try:
            response = self.s3.get_object(Bucket=self.release.bucket, Key=entry.key)
            with tarball.open("wb") as out:
                for chunk in iter(lambda: response["Body"].read(_CHUNK), b""):
                    digest.update(chunk)
                    out.write(chunk)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "?")
            raise validation_error(
                f"TargetModel {entry.target!r}: failed to download model data "
                f"(bucket: {self.release.bucket}, key: {entry.key}): {code}"
            ) from None
        if digest.hexdigest() != entry.sha256:
            raise validation_error(
                f"TargetModel {entry.target!r}: model data s3://{self.release.bucket}/{entry.key} has sha256 "
                f"{digest.hexdigest()[:16]}..., the release index says {entry.sha256[:16]}...; refusing to load it"
            )
        try:
            safe_extract(tarball, directory, model=entry.target)
        except ModelBuildError as error:
            raise validation_error(f"TargetModel {entry.target!r}: {error}") from None
        finally:
            tarball.unlink(missing_ok=True)
        localize_configs(directory)

    def _make_room(self, target: str, size: int) -> None:
        if self.budget is None:
            return
        if size > self.budget:
            raise model_error(target, 507, f"model needs {size} bytes unpacked, more than the whole "
                              f"memory budget of {self.budget} bytes", what="while loading")
        while self.loaded_bytes() + size > self.budget and self._evict_one():
            pass

    def _register(self, target: str, name: str, directory: Path, size: int) -> None:
        document = json.dumps({"model_name": name, "url": str(directory)}).encode()
        while True:
            answer = self.server.request("POST", "/models", document, headers={"Content-Type": "application/json"},
                                         timeout=LOAD_TIMEOUT_SECONDS)
            if answer.status in (200, 409):
                return
            message = _server_message(answer.body, name, target)
            if answer.status == 507 and self._evict_one():
                continue  # as SageMaker does: unload the least recently used model and retry
            raise model_error(target, answer.status, message, what="while loading")

    def _evict_one(self) -> bool:
        """Unload the least recently used idle model; False when none can go."""
        with self._state:
            victim = next((t for t, item in self._loaded.items() if item.in_flight == 0), None)
            if victim is None:
                return False
            item = self._loaded.pop(victim)
        self.unload(item)
        return True

    def unload(self, item: Loaded) -> None:
        self.server.request("DELETE", f"/models/{item.name}", timeout=LOAD_TIMEOUT_SECONDS)
        shutil.rmtree(item.directory.parent, ignore_errors=True)
        self.unloads += 1

    def unload_all(self) -> None:
        with self._state:
            items = list(self._loaded.values())
            self._loaded.clear()
        for item in items:
            self.unload(item)

