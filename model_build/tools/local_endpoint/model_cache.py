"""SageMaker's part of a multi-model endpoint, in front of the real ``tritonserver``.

On a SageMaker MME the platform, not Triton, maps ``TargetModel`` to an S3 key under the model
data URL, downloads and unpacks the tarball on first use into ``/opt/ml/models/<hash>/model``,
asks the container to load it (``POST /models``), routes invocations to ``/models/<hash>/invoke``,
and unloads least-recently-used models when memory runs short (a load answered 507 unloads one
and retries). This module plays that part against a published release:

- a target is the object ``<served prefix>/<TargetModel>``, looked up when it is first invoked,
  as SageMaker does: a model published while the endpoint runs is invocable at once, with no
  restart, and a missing object answers as SageMaker answers (400, "failed to download model
  data"). Where the routes document (or, for a release of the earlier per-release layout, its
  index) names the target's sha256, the download is checked against it before anything is
  unpacked; it is unpacked with the project's safe extraction;
- ``KIND_GPU`` instance groups become ``KIND_CPU`` in the local copy of each ``config.pbtxt``
  (the only change to the published bytes: this machine has no GPU); a TensorRT plan, which no
  CPU can run, is refused with one error of its own (501 ``CannotServeOnCpu``) and never loaded;
- concurrent first calls for one target load it once; a failure answers that call and the ones
  waiting on it, and the next call tries again;
- load, eviction and unload of one target are mutually exclusive (each holds the target's lock
  from the first file written to the last one removed), so a call for a target that is being
  evicted waits for the unload to finish and then loads it again into a fresh folder;
- the memory budget counts the **unpacked size** of each loaded model (what SageMaker also sizes
  its cache by on disk); the server's resident memory is not measured. A load **reserves** its
  size under the cache's lock before it registers the model, so loads of different targets at the
  same time never exceed the budget together; a load that finds no room and no idle model to
  unload waits for models in use (or other loads) to finish, up to ``LOAD_TIMEOUT_SECONDS``;
- a load the server answers 507 (out of memory) unloads the least recently used idle model and
  retries, **at most ``MAX_OOM_RETRIES`` times per load**; then the 507 is relayed. A model that
  is always out of memory so costs at most that many unloads per call, never every idle model.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import shutil
import threading
import time
from collections import Counter, OrderedDict
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.tools.local_endpoint.served_release import Entry, Release
from triton_mme_cdk.model_build.tools.local_endpoint.triton_server import TritonServer

#: How long one load may take before the call fails (a python stub that never starts hangs the load).
LOAD_TIMEOUT_SECONDS = 300.0
#: Unload-and-retry rounds after a load answered 507, per load (see the module docstring).
MAX_OOM_RETRIES = 2
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


#: The error code (and HTTP status: 501, not implemented here) of a target this CPU-only endpoint
#: cannot load at all: a prebuilt TensorRT plan. The smoke test reports such a target as skipped.
CANNOT_SERVE_ON_CPU = "CannotServeOnCpu"
CANNOT_SERVE_STATUS = 501


def validation_error(message: str) -> EndpointError:
    return EndpointError(400, "ValidationError", message)


#: What a call to a server that died raises: its connection reset or closed, its socket or port gone.
UNREACHABLE = (OSError, http.client.HTTPException)


def unavailable(target: str, error: BaseException) -> EndpointError:
    """A call the container could not answer (it died, or is restarting): 503, at once."""
    return EndpointError(503, "ServiceUnavailable", f"TargetModel {target!r}: the model container (tritonserver) "
                         f"did not answer ({type(error).__name__}); the endpoint restarts it, retry")


def model_error(target: str, status: int, message: str, *, what: str = "from primary") -> EndpointError:
    """A container answer other than 200, relayed as SageMaker does: 424 ``ModelError``."""
    kind = "server" if status >= 500 else "client"
    return EndpointError(
        424, "ModelError",
        f"TargetModel {target!r}: received {kind} error ({status}) {what} with message \"{message}\"",
        original_status=status, original_message=message,
    )


@dataclass
class Loaded:
    name: str
    directory: Path
    size: int
    in_flight: int = 0


def model_name_for(target: str) -> str:
    """The name the platform loads a target under (a hash of the target, as SageMaker does)."""
    return hashlib.sha256(target.encode()).hexdigest()[:32]


class ConfigParseError(ModelBuildError):
    """A ``config.pbtxt`` of a tarball that does not parse as a Triton model config."""


class CpuUnservable(ModelBuildError):
    """A model no CPU can run (a TensorRT plan), found in a tarball's config before it is loaded."""


def localize_configs(model_root: Path, *, gpu: bool = False) -> None:
    """``KIND_GPU`` -> ``KIND_CPU`` in every config of an unpacked tarball (this machine has no GPU);
    with ``gpu`` (a server with GPU runtimes: ``make gpu-check``) the kinds stay as published.

    The configs are ``<model>/config.pbtxt`` of each model folder and a ``config.pbtxt`` at the
    tarball's root (a tarball packed from inside its model folder). One that does not parse raises
    :class:`ConfigParseError` naming the file and the parser's line and column. A TensorRT plan
    (``platform: "tensorrt_plan"`` or ``backend: "tensorrt"``) raises :class:`CpuUnservable`:
    turning its instances into CPU ones would only move the failure into the server's load.
    """
    from tritonclient.grpc import model_config_pb2 as mc

    paths = sorted(model_root.glob("*/config.pbtxt"))
    if (model_root / "config.pbtxt").is_file():
        paths.insert(0, model_root / "config.pbtxt")
    for path in paths:
        config = mc.ModelConfig()
        try:
            text_format.Parse(path.read_text(errors="replace"), config)
        except text_format.ParseError as error:
            raise ConfigParseError(f"{path.relative_to(model_root)}: not a valid model config: {error}") from None
        if config.platform == "tensorrt_plan" or config.backend == "tensorrt":
            raise CpuUnservable(f"{path.relative_to(model_root)}: a TensorRT plan")
        changed = False
        for group in () if gpu else config.instance_group:
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
    """Targets loaded on the server, least recently used first.

    Locks: ``_state`` (a condition) guards the bookkeeping (``_loaded``, ``_reserved``, the
    ``in_flight`` counts) and is never held across a server call; each target's own lock is held
    for the whole of a load, an eviction or an unload of that target. ``in_flight`` only grows
    under the target's lock, so an evictor holding that lock sees a count that cannot rise.
    """

    def __init__(self, *, server: TritonServer, s3_client: Any, release: Release, root: Path,
                 memory_budget_bytes: int | None = None) -> None:
        self.server = server
        self.s3 = s3_client
        self.release = release
        self.root = root
        self.budget = memory_budget_bytes
        self._loaded: OrderedDict[str, Loaded] = OrderedDict()
        self._state = threading.Condition(threading.Lock())
        self._target_locks: dict[str, threading.Lock] = {}
        #: Bytes promised to loads under way (counted against the budget with the loaded ones).
        self._reserved = 0
        self.loads = 0
        self.unloads = 0
        #: Invocations received per target (also the ones refused), for the stop line and tests.
        self.invocations: Counter[str] = Counter()
        #: The server's generation: one more at each restart (:meth:`server_restarted`).
        self.generation = 0

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
        except UNREACHABLE as error:
            raise unavailable(target, error) from None
        finally:
            with self._state:
                loaded.in_flight -= 1
                self._state.notify_all()
        if answer.status != 200:
            raise model_error(target, answer.status, _server_message(answer.body, loaded.name, target))
        return 200, answer.headers.get("Content-Type", "application/json"), answer.body

    def loaded_targets(self) -> list[str]:
        with self._state:
            return list(self._loaded)

    def server_restarted(self, server: TritonServer) -> None:
        """A new server took the place of one that died, as SageMaker restarts a model container:
        nothing is loaded on it, so each target loads again on its next use. A load under way on
        the dead server is not kept (its generation is gone)."""
        with self._state:
            self.server = server
            self.generation += 1
            self._loaded.clear()
            self._state.notify_all()

    def loaded_bytes(self) -> int:
        with self._state:
            return sum(item.size for item in self._loaded.values())

    # ---------------------------------------------------------------- loading

    def _lock_for(self, target: str) -> threading.Lock:
        with self._state:
            return self._target_locks.setdefault(target, threading.Lock())

    def _acquire(self, target: str) -> Loaded:
        entry = self.release.entry(self.s3, target)
        if entry is None:
            raise validation_error(
                f"TargetModel {target!r}: not in release {self.release.release_id} "
                f"({self.release.url}); the release lists {len(self.release.entries)} targets"
            )
        with self._lock_for(target):
            with self._state:
                loaded = self._loaded.get(target)
                if loaded is not None:
                    self._loaded.move_to_end(target)
                    loaded.in_flight += 1
                    return loaded
            loaded = self._load(entry)  # registered in ``_loaded`` by the load, still under our lock
            with self._state:
                loaded.in_flight += 1
                return loaded

    def _load(self, entry: Entry) -> Loaded:
        """Fetch, reserve room, register; the caller holds the target's lock."""
        name = model_name_for(entry.target)
        directory = self.root / name / "model"
        shutil.rmtree(directory.parent, ignore_errors=True)
        directory.mkdir(parents=True)
        reserved = 0
        generation = self.generation
        try:
            self._fetch(entry, directory)
            size = _tree_size(directory)
            reserved = self._make_room(entry.target, size)
            self._register(entry.target, name, directory)
            loaded = Loaded(name=name, directory=directory, size=size)
            with self._state:  # the reservation becomes a loaded model in one step
                if generation != self.generation:  # loaded on a server that died since
                    raise unavailable(entry.target, ConnectionResetError("restarted during the load"))
                self._reserved -= reserved
                reserved = 0
                self._loaded[entry.target] = loaded
                self.loads += 1
                self._state.notify_all()
        except BaseException:
            shutil.rmtree(directory.parent, ignore_errors=True)
            raise
        finally:
            if reserved:
                with self._state:
                    self._reserved -= reserved
                    self._state.notify_all()
        return loaded

    def _fetch(self, entry: Entry, directory: Path) -> None:
        """Download, check the digest, unpack safely, localize the configs."""
        from botocore.exceptions import ClientError

        from triton_mme_cdk.model_build.artifact.tarball import safe_extract

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
        if entry.sha256 is not None and digest.hexdigest() != entry.sha256:
            said = "the routes say" if self.release.model_prefix is not None else "the release index says"
            raise validation_error(
                f"TargetModel {entry.target!r}: model data s3://{self.release.bucket}/{entry.key} has sha256 "
                f"{digest.hexdigest()[:16]}..., {said} {entry.sha256[:16]}...; refusing to load it"
            )
        try:
            safe_extract(tarball, directory, model=entry.target)
        except ModelBuildError as error:
            raise validation_error(f"TargetModel {entry.target!r}: {error}") from None
        finally:
            tarball.unlink(missing_ok=True)
        try:
            localize_configs(directory)
        except CpuUnservable:
            # Refused here, in the endpoint's own words: the server is never asked to load it, so no
            # other backend answers for it and the models already loaded keep serving.
            raise EndpointError(
                CANNOT_SERVE_STATUS, CANNOT_SERVE_ON_CPU,
                f"model {entry.target!r} is a TensorRT plan (tensorrt_plan); the local endpoint runs on CPU and "
                "cannot load it (a plan runs only on the GPU it was built for: check it on a GPU endpoint)",
            ) from None
        except ConfigParseError as error:
            # The server would refuse the load with a 400: SageMaker relays that as a ModelError.
            raise model_error(entry.target, 400, f"failed to load {entry.target!r}: {error}",
                              what="while loading") from None

    def _make_room(self, target: str, size: int) -> int:
        """Reserve ``size`` bytes of the budget, unloading idle models first; the bytes reserved.

        Waits (up to ``LOAD_TIMEOUT_SECONDS``) while no idle model can go but models in use or
        other loads may free room; then answers 507 as the platform does when nothing can go.
        """
        if self.budget is None:
            return 0
        if size > self.budget:
            raise model_error(target, 507, f"model needs {size} bytes unpacked, more than the whole "
                              f"memory budget of {self.budget} bytes", what="while loading")
        deadline = time.monotonic() + LOAD_TIMEOUT_SECONDS
        while True:
            with self._state:
                used = sum(item.size for item in self._loaded.values()) + self._reserved
                if used + size <= self.budget:
                    self._reserved += size
                    return size
            if self._evict_one(exclude=target):
                continue
            with self._state:
                # Another load may finish, and any other loaded model goes once it is idle and its
                # lock is free (a first invocation holds it for a moment even with nothing in
                # flight): only with neither is there nothing to wait for.
                may_free = self._reserved > 0 or any(name != target for name in self._loaded)
                remaining = deadline - time.monotonic()
                if not may_free or remaining <= 0:
                    raise model_error(
                        target, 507, f"model needs {size} bytes unpacked; {used} of the memory budget of "
                        f"{self.budget} bytes are held by models in use or loading", what="while loading")
                self._state.wait(min(remaining, 1.0))

    def _register(self, target: str, name: str, directory: Path) -> None:
        """``POST /models``; a 507 unloads the LRU idle model and retries, ``MAX_OOM_RETRIES`` times at most."""
        document = json.dumps({"model_name": name, "url": str(directory)}).encode()
        retries = 0
        while True:
            try:
                answer = self.server.request("POST", "/models", document, headers={"Content-Type": "application/json"},
                                             timeout=LOAD_TIMEOUT_SECONDS)
            except UNREACHABLE as error:
                raise unavailable(target, error) from None
            if answer.status in (200, 409):
                return
            message = _server_message(answer.body, name, target)
            if answer.status == 507 and retries < MAX_OOM_RETRIES and self._evict_one(exclude=target):
                retries += 1
                continue  # as SageMaker does: unload the least recently used model and retry
            raise model_error(target, answer.status, message, what="while loading")

    def _evict_one(self, exclude: str | None = None) -> bool:
        """Unload the least recently used idle model; False when none can go.

        Takes the victim's target lock (without waiting: a target whose lock is held is being
        loaded, invoked for the first time or evicted by another thread, so it is skipped), checks
        under that lock that it is still loaded and idle, and unloads it before letting go.
        """
        with self._state:
            candidates = [t for t, item in self._loaded.items() if item.in_flight == 0 and t != exclude]
        for victim in candidates:
            lock = self._lock_for(victim)
            if not lock.acquire(blocking=False):
                continue
            try:
                with self._state:
                    item = self._loaded.get(victim)
                    if item is None or item.in_flight:
                        continue
                    del self._loaded[victim]
                self._unload(victim, item)
                return True
            finally:
                lock.release()
        return False

    def _unload(self, target: str, item: Loaded) -> None:
        """``DELETE`` then remove the folder; the caller holds the target's lock."""
        try:
            with suppress(*UNREACHABLE):  # a server that died holds nothing: the folder goes all the same
                self.server.request("DELETE", f"/models/{item.name}", timeout=LOAD_TIMEOUT_SECONDS)
            shutil.rmtree(item.directory.parent, ignore_errors=True)
        finally:
            with self._state:
                self.unloads += 1
                self._state.notify_all()

    def unload_all(self) -> None:
        """Unload every loaded model, each under its target's lock (waits for loads under way)."""
        for target in self.loaded_targets():
            with self._lock_for(target):
                with self._state:
                    item = self._loaded.pop(target, None)
                if item is not None:
                    self._unload(target, item)
