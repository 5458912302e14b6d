"""Models come and go on a live fleet: what changes with the model set never reaches the fleet.

- Synth (the real CDK): the same stack for a base manifest and for it with one model added, one
  changed and one removed gives byte-identical SageMaker and autoscaling resources; changing the
  instance type changes them.
- The served layout against moto's S3 server: immutable names, the routes document and its bad
  input (missing, truncated, another stack's, a served object with other bytes), the retention
  window, the plan with its exit codes, the per-release prefixes of the earlier layout.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from cdk_helpers import subprocess_env, synth
from s3_faults import FaultProxy, Rule

from triton_mme_cdk.model_build.aws_clients import make_s3_client
from triton_mme_cdk.model_build.release import Release, routes_key
from triton_mme_cdk.model_build.release.index import read_index, read_routes
from triton_mme_cdk.model_build.release.routes import RoutesError, parse_routes, served_name
from triton_mme_cdk.model_build.release.serving import (
    ActivationReport,
    activate_release,
    delete_legacy_release,
    legacy_releases,
)
from triton_mme_cdk.model_build.release.store import ReleaseTarget, assemble_release, publish_unit
from triton_mme_cdk.model_build.tools.local_s3 import local_s3
from triton_mme_cdk.model_build.types import Artifact
from triton_mme_client import ModelNotFound, RouteResolver
from triton_mme_client import errors as client_errors

ROOT = Path(__file__).resolve().parents[1]
FLEET_TYPES = {"AWS::SageMaker::Model", "AWS::SageMaker::EndpointConfig", "AWS::SageMaker::Endpoint",
               "AWS::ApplicationAutoScaling::ScalableTarget", "AWS::ApplicationAutoScaling::ScalingPolicy"}


def _entry(name: str, seed: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "task": "image-classification", "max_batch_size": 2, "image": {"image_size": 32},
            "source": {"kind": "synthetic", "architecture": "resnet", "seed": seed,
                       "config": {"embedding_size": 8, "hidden_sizes": [8, 8, 8, 8], "depths": [1, 1, 1, 1],
                                  "layer_type": "basic", "num_labels": 4}}, **extra}


def _fleet(tmp: Path, models: list[dict[str, Any]], **settings: Any) -> dict[str, Any]:
    path = tmp / f"m-{uuid.uuid4().hex[:8]}.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "models": copy.deepcopy(models)}))
    data = synth(tmp / uuid.uuid4().hex[:8], nag=False, manifest_path=path, **settings).data
    return {name: resource for name, resource in data["Resources"].items() if resource["Type"] in FLEET_TYPES}


@pytest.mark.slow
def test_model_set_changes_leave_the_fleet_resources_byte_identical(tmp_path: Path) -> None:
    base = [_entry("a", 0), _entry("b", 1), _entry("c", 2)]
    changed = [_entry("a", 0), _entry("b", 7), _entry("d", 3)]  # b changed, c removed, d added
    first, second = _fleet(tmp_path, base), _fleet(tmp_path, changed)
    assert {r["Type"] for r in first.values()} == FLEET_TYPES
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    model = next(r for r in first.values() if r["Type"] == "AWS::SageMaker::Model")
    url = json.dumps(model["Properties"]["PrimaryContainer"]["ModelDataUrl"])
    assert "served/" in url and "GetAtt" not in url and "ModelBuild" not in url, url
    endpoint = next(r for r in first.values() if r["Type"] == "AWS::SageMaker::Endpoint")
    assert any(dep.startswith("ModelBuild") for dep in endpoint.get("DependsOn", [])), "waits for the first build"
    # A fleet setting does change them: a blue/green rollout, as before.
    bigger = _fleet(tmp_path, base, instance_type="ml.g5.2xlarge")
    assert json.dumps(first, sort_keys=True) != json.dumps(bigger, sort_keys=True)


# ---------------------------------------------------------------------------------------------
# The served layout on S3
# ---------------------------------------------------------------------------------------------

PREFIX = "models"


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    with local_s3() as url:
        client = make_s3_client(endpoint_url=url)
        client.endpoint_url_for_tests = url
        yield client


@pytest.fixture()
def bucket(s3: Any) -> str:
    name = f"live-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


def _artifact(tmp: Path, name: str, payload: bytes) -> Artifact:
    import hashlib

    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f"{name}-{hashlib.sha256(payload).hexdigest()[:8]}.tar.gz"
    path.write_bytes(payload)
    return Artifact(name=name, format="onnx", path=path, sha256=hashlib.sha256(payload).hexdigest(),
                    size=len(payload), targets=(name,))


def _release(s3: Any, bucket: str, tmp: Path, models: dict[str, bytes], release_id: str) -> Release:
    """Store each model, place the release in the served prefix and write its index (no routing)."""
    from triton_mme_cdk.model_build.release.store import StoredModel

    stored = []
    for name, payload in models.items():
        artifact = _artifact(tmp, name, payload)
        key = "k-" + artifact.sha256[:32]
        publish_unit(artifact, key, s3_client=s3, bucket=bucket, model_prefix=PREFIX)
        stored.append(StoredModel(name, key, (name,), "onnx", entry_sha256=f"e-{name}-{artifact.sha256[:8]}"))
    release = Release(release_id, "0" * 64, "c" * 64)
    assemble_release(stored, ReleaseTarget.of(release, s3, bucket, PREFIX))
    return release


def _served(s3: Any, bucket: str) -> set[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{PREFIX}/served/")
    return {item["Key"].rsplit("/", 1)[1] for page in pages for item in page.get("Contents", [])}


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def days(self, n: float) -> None:
        self.now += n * 86400


def test_retention_window_deletes_only_unrouted_objects_and_rollback_copies_back(
        s3: Any, bucket: str, tmp_path: Path) -> None:
    clock = Clock()
    _release(s3, bucket, tmp_path, {"a": b"A1", "b": b"B1"}, "r-000000000000000a")
    first = activate_release(s3, bucket, PREFIX, "r-000000000000000a", clock=clock, retention_days=7)
    assert first.routed == 2 and first.verified == 2 and first.wrote
    a1, b1 = served_name("a", _sha(b"A1")), served_name("b", _sha(b"B1"))
    assert _served(s3, bucket) == {a1, b1}

    _release(s3, bucket, tmp_path, {"a": b"A1", "b": b"B2"}, "r-000000000000000b")
    clock.days(1)
    second = activate_release(s3, bucket, PREFIX, "r-000000000000000b", clock=clock, retention_days=7)
    b2 = served_name("b", _sha(b"B2"))
    assert second.unrouted_now == [b1] and second.deleted == []
    assert _served(s3, bucket) == {a1, b1, b2}, "the old build stays for the window"

    clock.days(6.9)
    assert activate_release(s3, bucket, PREFIX, "r-000000000000000b", clock=clock).deleted == []
    clock.days(0.2)
    third = activate_release(s3, bucket, PREFIX, "r-000000000000000b", clock=clock, retention_days=7)
    assert third.deleted == [b1] and _served(s3, bucket) == {a1, b2}, "only the unrouted object went"
    routes = read_routes(s3, bucket, PREFIX)
    assert routes is not None and routes.unrouted == {}

    # A rollback past the window: the object is copied back from the store, nothing is built.
    back = activate_release(s3, bucket, PREFIX, "r-000000000000000a", clock=clock)
    assert back.copied == 1 and _served(s3, bucket) == {a1, b1, b2}
    routes = read_routes(s3, bucket, PREFIX)
    assert routes is not None and routes.routes["b"].target_model == b1


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_a_served_object_with_other_bytes_is_refused_and_the_previous_routes_keep_serving(
        s3: Any, bucket: str, tmp_path: Path) -> None:
    _release(s3, bucket, tmp_path, {"a": b"A1"}, "r-000000000000000a")
    activate_release(s3, bucket, PREFIX, "r-000000000000000a")
    before = s3.get_object(Bucket=bucket, Key=routes_key(PREFIX))["Body"].read()
    # Someone overwrote the next release's served object (same name, other bytes).
    _release(s3, bucket, tmp_path, {"a": b"A1", "n": b"N1"}, "r-000000000000000b")
    key = f"{PREFIX}/served/{served_name('n', _sha(b'N1'))}"
    s3.put_object(Bucket=bucket, Key=key, Body=b"tampered", Metadata={"sha256": _sha(b"tampered")})
    with pytest.raises(RoutesError) as caught:
        activate_release(s3, bucket, PREFIX, "r-000000000000000b")
    message = str(caught.value)
    assert caught.value.model == "n" and key in message and "previous routes keep serving" in message
    assert s3.get_object(Bucket=bucket, Key=routes_key(PREFIX))["Body"].read() == before
    # The publish itself never overwrites it either.
    from triton_mme_cdk.model_build.errors import PublishError

    with pytest.raises(PublishError) as refused:
        _release(s3, bucket, tmp_path, {"n": b"N1"}, "r-000000000000000c")
    assert "never gets new bytes" in str(refused.value) and refused.value.model == "n"
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"tampered", "not overwritten"


@pytest.mark.parametrize(("body", "expected"), [
    (b'{"schema": "triton-mme/routes/1", "release_id": "r-1", "rou', "truncated"),
    (b"[]", "schema 'list'"),
    (b'{"schema": "triton-mme/routes/9"}', "schema 'triton-mme/routes/9'"),
    (b'{"schema": "triton-mme/routes/1", "release_id": "r"}', "malformed"),
    (b'{"schema": "triton-mme/routes/1", "stack": "arn:other", "release_id": "r", "model_data_url": "", '
     b'"index_key": "", "routes": {}}', "written by stack 'arn:other'"),
])
def test_a_bad_routes_document_is_one_error_naming_the_key(
        s3: Any, bucket: str, tmp_path: Path, body: bytes, expected: str) -> None:
    _release(s3, bucket, tmp_path, {"a": b"A1"}, "r-000000000000000a")
    s3.put_object(Bucket=bucket, Key=routes_key(PREFIX), Body=body)
    with pytest.raises(RoutesError) as caught:
        activate_release(s3, bucket, PREFIX, "r-000000000000000a", stack="arn:this")
    assert expected in str(caught.value) and f"s3://{bucket}/{routes_key(PREFIX)}" in str(caught.value)
    assert s3.get_object(Bucket=bucket, Key=routes_key(PREFIX))["Body"].read() == body, "nothing overwritten"


def test_the_resolver_caches_and_sees_a_new_model_at_once(s3: Any, bucket: str, tmp_path: Path) -> None:
    resolver = RouteResolver(s3, bucket, routes_key(PREFIX), refresh_seconds=3600)
    with pytest.raises(client_errors.RoutesError, match="missing"):
        resolver.target_model("a")
    _release(s3, bucket, tmp_path, {"a": b"A1"}, "r-000000000000000a")
    activate_release(s3, bucket, PREFIX, "r-000000000000000a")
    assert resolver.target_model("a") == served_name("a", _sha(b"A1"))
    assert resolver.target_model("a") == served_name("a", _sha(b"A1")) and resolver.reads == 1, "cached"
    _release(s3, bucket, tmp_path, {"a": b"A1", "new": b"X"}, "r-000000000000000b")
    activate_release(s3, bucket, PREFIX, "r-000000000000000b")
    assert resolver.target_model("new") == served_name("new", _sha(b"X")), "an unknown name refreshes once"
    with pytest.raises(ModelNotFound, match="'gone': not routed"):
        resolver.target_model("gone")


def test_legacy_release_prefixes_are_listed_and_deleted_on_request(s3: Any, bucket: str) -> None:
    for release in ("r-00000000000000aa", "r-00000000000000bb"):
        s3.put_object(Bucket=bucket, Key=f"{PREFIX}/{release}/m.tar.gz", Body=b"x" * 10)
    s3.put_object(Bucket=bucket, Key=f"{PREFIX}/served/m-0123456789ab.tar.gz", Body=b"y")
    assert legacy_releases(s3, bucket, PREFIX) == {"r-00000000000000aa": (1, 10), "r-00000000000000bb": (1, 10)}
    assert delete_legacy_release(s3, bucket, PREFIX, "r-00000000000000aa") >= 1
    assert list(legacy_releases(s3, bucket, PREFIX)) == ["r-00000000000000bb"]
    assert _served(s3, bucket) == {"m-0123456789ab.tar.gz"}


# ---------------------------------------------------------------------------------------------
# Two writers of the routes (issue 38): the routes PUT is a compare-and-swap
# ---------------------------------------------------------------------------------------------

ROUTES_PUT = r"/_routes/routes\.json(\?|$)"


def _race(s3: Any, bucket: str, *writers: dict[str, Any]) -> tuple[list[Any], list[int | None]]:
    """Activate each writer's release at once, each with its own client through its own proxy.

    Each writer starts once the one before holds its routes PUT, so all read the same version and
    run their other steps in the order given; the held PUTs are then let through in that order, each
    answered before the next goes. Returns each writer's report or error, and the statuses of every
    routes PUT in the order the server answered them."""
    url = s3.endpoint_url_for_tests
    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(FaultProxy(url)) for _ in writers]
        gates = [threading.Event() for _ in writers]
        rules = [proxy.add(Rule("hold", method="PUT", path=ROUTES_PUT, gate=gate)) for proxy, gate in zip(
            proxies, gates, strict=True)]

        def activate(proxy: FaultProxy, writer: dict[str, Any]) -> Any:
            try:
                return activate_release(make_s3_client(endpoint_url=proxy.url), bucket, PREFIX, **writer)
            except RoutesError as error:
                return error

        def answered(proxy: FaultProxy) -> list[Any]:
            return [r for r in proxy.forwarded("PUT") if re.search(ROUTES_PUT, r.target)]

        with ThreadPoolExecutor(len(writers)) as pool:
            futures = []
            for proxy, writer, rule in zip(proxies, writers, rules, strict=True):
                futures.append(pool.submit(activate, proxy, writer))
                _until("the writer holds its routes PUT", lambda held: held.hits == 1, rule)
            for proxy, gate in zip(proxies, gates, strict=True):
                gate.set()
                _until("the released PUT is answered", lambda through: len(answered(through)) >= 1, proxy)
            outcomes = [future.result(timeout=120) for future in futures]
        puts = sorted((r for proxy in proxies for r in answered(proxy)), key=lambda r: r.at)
    return outcomes, [r.status for r in puts]


def _until(what: str, condition: Callable[[Any], bool], subject: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition(subject):
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def _no_object_unlisted(s3: Any, bucket: str) -> Any:
    """The live routes, after checking that every served object is routed or listed as unrouted."""
    routes = read_routes(s3, bucket, PREFIX)
    assert routes is not None
    listed = routes.routed_targets() | set(routes.unrouted)
    assert _served(s3, bucket) <= listed, f"served but neither routed nor unrouted: {_served(s3, bucket) - listed}"
    return routes


def test_two_publishers_racing_with_other_releases_lose_no_route(s3: Any, bucket: str, tmp_path: Path) -> None:
    """A stack deploy and a ``publish`` read the same routes, each adding a model: the first PUT
    wins; the second is refused by S3 (412), re-reads, and fails with one line naming the winner's
    release, its own new object listed as unrouted. Before: both PUTs succeeded and the winner's
    new model was served by nothing and listed nowhere."""
    _release(s3, bucket, tmp_path, {"a": b"A1", "b": b"B1"}, "r-000000000000000a")
    activate_release(s3, bucket, PREFIX, "r-000000000000000a")
    _release(s3, bucket, tmp_path, {"a": b"A1", "b": b"B1", "deployed": b"D1"}, "r-000000000000000b")
    _release(s3, bucket, tmp_path, {"a": b"A1", "b": b"B1", "published": b"P1"}, "r-000000000000000c")
    (won, lost), statuses = _race(s3, bucket, {"release_id": "r-000000000000000b", "stack": "arn:stack"},
                                  {"release_id": "r-000000000000000c"})
    assert isinstance(won, ActivationReport) and won.wrote and won.conflicts == 0
    assert isinstance(lost, RoutesError), lost
    message = str(lost)
    assert "\n" not in message and f"s3://{bucket}/{routes_key(PREFIX)}" in message
    assert "routed release r-000000000000000b" in message and "stack arn:stack" in message
    assert "r-000000000000000c is not routed" in message and "r-000000000000000b keeps serving" in message
    assert statuses[:2] == [200, 412], "the second writer's PUT was refused, not applied"
    routes = _no_object_unlisted(s3, bucket)
    assert routes.release_id == "r-000000000000000b"
    assert routes.routes["deployed"].target_model == served_name("deployed", _sha(b"D1")), "the winner's route"
    assert served_name("published", _sha(b"P1")) in routes.unrouted, "the loser's object is listed"


def test_a_racing_writer_of_the_release_it_read_is_reapplied(s3: Any, bucket: str, tmp_path: Path) -> None:
    """The other writer re-routed the release this activation had read (new bookkeeping: an object
    past the retention window deleted): the change still applies, so it runs again on the new
    routes and writes them; nothing is listed that is gone, nothing served is unlisted."""
    clock = Clock()
    _release(s3, bucket, tmp_path, {"a": b"A0"}, "r-0000000000000000")
    activate_release(s3, bucket, PREFIX, "r-0000000000000000", clock=clock)
    _release(s3, bucket, tmp_path, {"a": b"A1", "b": b"B1"}, "r-000000000000000a")
    activate_release(s3, bucket, PREFIX, "r-000000000000000a", clock=clock)  # a-A0 unrouted from now
    _release(s3, bucket, tmp_path, {"a": b"A1", "b": b"B2", "c": b"C1"}, "r-000000000000000b")
    clock.days(8)
    old = served_name("a", _sha(b"A0"))
    (again, new), statuses = _race(
        s3, bucket, {"release_id": "r-000000000000000a", "clock": clock, "retention_days": 7},
        {"release_id": "r-000000000000000b", "clock": clock, "retention_days": 30})
    assert isinstance(again, ActivationReport) and again.deleted == [old] and again.wrote
    assert isinstance(new, ActivationReport), new
    assert new.conflicts == 1 and new.wrote and new.previous_release == "r-000000000000000a"
    assert statuses == [200, 412, 200]
    routes = _no_object_unlisted(s3, bucket)
    assert routes.release_id == "r-000000000000000b" and old not in routes.unrouted and old not in _served(s3, bucket)
    assert set(routes.unrouted) == {served_name("b", _sha(b"B1"))}


def test_an_object_deleted_by_the_loser_that_the_winner_routes_is_copied_back(
        s3: Any, bucket: str, tmp_path: Path) -> None:
    """A rollback routes an object past the retention window that a racing activation deletes
    (it read the object as unrouted and expired): the rollback's PUT wins, the other fails and
    copies the object back from the store, so no route points at nothing."""
    clock = Clock()
    _release(s3, bucket, tmp_path, {"a": b"A0"}, "r-0000000000000000")
    activate_release(s3, bucket, PREFIX, "r-0000000000000000", clock=clock)
    _release(s3, bucket, tmp_path, {"a": b"A1"}, "r-000000000000000a")
    activate_release(s3, bucket, PREFIX, "r-000000000000000a", clock=clock)
    _release(s3, bucket, tmp_path, {"a": b"A2"}, "r-000000000000000b")
    clock.days(8)
    old = served_name("a", _sha(b"A0"))
    (rollback, lost), statuses = _race(
        s3, bucket, {"release_id": "r-0000000000000000", "clock": clock},
        {"release_id": "r-000000000000000b", "clock": clock, "retention_days": 7})
    assert isinstance(rollback, ActivationReport) and rollback.wrote
    assert isinstance(lost, RoutesError) and "routed release r-0000000000000000" in str(lost)
    assert statuses[:2] == [200, 412]
    routes = _no_object_unlisted(s3, bucket)
    assert routes.routes["a"].target_model == old and old in _served(s3, bucket), "copied back from the store"
    assert served_name("a", _sha(b"A2")) in routes.unrouted


def test_a_retried_activation_racing_the_first_document_writes_once(s3: Any, bucket: str, tmp_path: Path) -> None:
    """No routes yet: both writers put with ``If-None-Match: *``; the second is refused, re-reads
    its own release routed and has nothing left to write."""
    _release(s3, bucket, tmp_path, {"a": b"A1"}, "r-000000000000000a")
    (first, second), statuses = _race(s3, bucket, {"release_id": "r-000000000000000a"},
                                      {"release_id": "r-000000000000000a"})
    assert isinstance(first, ActivationReport) and first.wrote and first.conflicts == 0
    assert isinstance(second, ActivationReport) and not second.wrote and second.conflicts == 1
    assert statuses == [200, 412]
    assert _no_object_unlisted(s3, bucket).release_id == "r-000000000000000a"


# ---------------------------------------------------------------------------------------------
# plan: the pull-request view, with exit codes a pipeline can gate on
# ---------------------------------------------------------------------------------------------


def _plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "model_build", "plan", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=subprocess_env())


@pytest.fixture
def here(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., Any]:
    """Runs a command's own entry point in this process, as :func:`_plan` and ``run_app`` run it in a
    new one (the same working directory and environment, ``CDK_*`` and ``AWS_*`` left out): the CLI's
    ``main(["plan", ...])``, or ``app.main(context, outdir)`` (what ``python app.py`` runs, with the
    context and output folder the CDK CLI passes it in the environment). A test keeps one case of
    each command a fresh process (its start-up imports, jsii's node process, the exit status through
    ``sys.exit``); the others reuse this process's imports and jsii, about 5 s of CPU each (a plan
    loads the app's settings, which imports aws-cdk-lib and starts jsii; a synth's first run in a
    process costs Node.js about 4.5 s). Returns what ``subprocess.run`` would: status, stdout, stderr."""
    from triton_mme_cdk.model_build.__main__ import main as cli_main

    monkeypatch.chdir(ROOT)
    env = subprocess_env()
    for name in [k for k in os.environ if k not in env]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    def run(command: str, *args: str, settings: dict[str, str] | None = None,
            outdir: Path | None = None) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        if command == "plan":
            code = cli_main(["plan", *args])
        else:
            import app

            assert command == "app.py" and outdir is not None
            code = app.main({f"mme:{k}": v for k, v in (settings or {}).items()}, str(outdir))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess([command, *args], code, out, err)

    return run


@pytest.mark.slow
def test_plan_lists_the_model_changes_with_exit_codes(tmp_path: Path, here: Callable[..., Any]) -> None:
    """The model side of ``plan`` from the command line (tests/test_plan.py judges the fleet and
    the data): entries added, updated and removed, each with its exit code. The first run is a
    fresh ``python -m model_build plan``; the others run the CLI's ``main`` in this process (``here``)."""
    from triton_mme_cdk.model_build.manifest import parse_manifest
    from triton_mme_cdk.model_build.release import compute_release, entry_sha256, model_code_sha256
    from triton_mme_cdk.model_build.release.deployed import record_from_template
    from triton_mme_cdk.model_build.release.routes import Route, Routes

    base: dict[str, Any] = {"version": 1, "models": [_entry("a", 0), _entry("b", 1, copies=2), _entry("c", 2)]}
    manifest = parse_manifest(copy.deepcopy(base))
    release = compute_release(manifest, base_dir=tmp_path)
    template = synth(tmp_path / "synth", nag=False).data
    template_file = tmp_path / "template.json"
    template_file.write_text(json.dumps(template))
    routes = {target: Route(target, f"{target}-000000000000.tar.gz", "0" * 64, 1, release.model_keys[spec.name],
                            spec.name, entry_sha256(spec, tmp_path))
              for spec in manifest.models for target in spec.target_names()}
    live = Routes(release.release_id, "s3://b/models/served/", "k", routes, model_code_sha256=model_code_sha256(),
                  deployed=record_from_template(template))
    routes_file = tmp_path / "routes.json"
    routes_file.write_bytes(live.body())

    def run(models: list[dict[str, Any]], *extra: str, fresh: bool = False) -> subprocess.CompletedProcess[str]:
        path = tmp_path / f"{uuid.uuid4().hex[:8]}.yaml"
        path.write_text(yaml.safe_dump({"version": 1, "models": copy.deepcopy(models)}))
        args = ("--manifest", str(path), "--routes-file", str(routes_file), "--template", str(template_file),
                "--detailed-exitcode", *extra)
        return _plan(*args) if fresh else here("plan", *args)

    same = run(base["models"], fresh=True)
    assert same.returncode == 0, same.stderr
    assert "models: 0 added, 0 updated, 0 removed, 4 unchanged; fleet unchanged" in same.stdout
    change = run([_entry("a", 0), _entry("b", 9, copies=2), _entry("d", 4)])
    assert change.returncode == 3, change.stderr
    assert "+ d  (added)" in change.stdout and "- c  c-000000000000.tar.gz" in change.stdout
    assert "~ b-0  b-0-000000000000.tar.gz -> new build (manifest entry changed)" in change.stdout
    assert "models: 1 added, 2 updated, 1 removed, 1 unchanged; fleet unchanged" in change.stdout
    # Without the flag a plan that ran exits 0; a broken routes file is one error line.
    assert run(base["models"]).returncode == 0 and run(base["models"], "-v").returncode == 0
    assert here("plan", "--routes-file", str(routes_file), "--template", str(template_file)).returncode == 0
    routes_file.write_bytes(live.body()[:40])
    broken = here("plan", "--manifest", "models.yaml", "--routes-file", str(routes_file), "--template",
                  str(template_file))
    assert broken.returncode == 1 and "truncated" in broken.stdout + broken.stderr
    assert "Traceback" not in broken.stdout + broken.stderr


def test_routes_document_round_trips_and_names_no_bookkeeping_in_the_served_prefix(
        s3: Any, bucket: str, tmp_path: Path) -> None:
    _release(s3, bucket, tmp_path, {"a": b"A1"}, "r-000000000000000a")
    record = {"schema": "triton-mme/deployed/1", "mappings": {},
              "resources": {"EndpointModel": {"Type": "AWS::SageMaker::Model", "Properties": {"Mode": "x"}}}}
    activate_release(s3, bucket, PREFIX, "r-000000000000000a", stack="arn:stack", deployed=record)
    body = s3.get_object(Bucket=bucket, Key=routes_key(PREFIX))["Body"].read()
    routes = parse_routes(body, where="test", stack="arn:stack")
    assert routes.body() == body and routes.deployed == record
    # A CLI publish (no record) keeps the deploy's record: it does not change the fleet.
    _release(s3, bucket, tmp_path, {"a": b"A2"}, "r-000000000000000b")
    activate_release(s3, bucket, PREFIX, "r-000000000000000b", stack="arn:stack")
    kept = parse_routes(s3.get_object(Bucket=bucket, Key=routes_key(PREFIX))["Body"].read(), where="test")
    assert kept.release_id == "r-000000000000000b" and kept.deployed == record
    assert routes.model_data_url == f"s3://{bucket}/{PREFIX}/served/"
    index = read_index(s3, bucket, routes.index_key)
    assert index is not None and index["release_id"] == "r-000000000000000a"
    assert all(name.endswith(".tar.gz") for name in _served(s3, bucket)), "tarballs only under ModelDataUrl"
    assert not routes_key(PREFIX).startswith(f"{PREFIX}/served/") and not routes.index_key.startswith(f"{PREFIX}/served/")


@pytest.mark.slow
def test_synth_prints_the_plan_against_a_routes_file(tmp_path: Path, here: Callable[..., Any]) -> None:
    """``cdk synth -c mme:plan_routes_file=...``: the synthesized template against the record in
    the routes, after the synth (the template is what is judged). The first run is a fresh
    ``python app.py``; the other two run ``app.main`` in this process (``here``)."""
    from cdk_helpers import run_app

    from triton_mme_cdk.model_build.manifest import load_manifest
    from triton_mme_cdk.model_build.release import compute_release, entry_sha256, model_code_sha256
    from triton_mme_cdk.model_build.release.deployed import record_from_template
    from triton_mme_cdk.model_build.release.routes import Route, Routes

    manifest = load_manifest(ROOT / "models.yaml")
    release = compute_release(manifest, base_dir=ROOT)
    routes = {target: Route(target, f"{target}-000000000000.tar.gz", "0" * 64, 1, release.model_keys[spec.name],
                            spec.name, entry_sha256(spec, ROOT))
              for spec in manifest.models for target in spec.target_names()}
    template = synth(tmp_path / "synth", nag=False).data
    live = Routes(release.release_id, "s3://b/models/served/", "k", routes, model_code_sha256=model_code_sha256(),
                  deployed=record_from_template(template))
    path = tmp_path / "routes.json"
    path.write_bytes(live.body())
    same = run_app(tmp_path / "a", {"plan_routes_file": str(path)})
    assert same.returncode == 0, same.stderr
    assert (f"plan against release {release.release_id}: models: 0 added, 0 updated, 0 removed, "
            f"{manifest.target_count} unchanged; fleet unchanged (verdict: no-change)") in same.stderr
    bigger = here("app.py", outdir=tmp_path / "b", settings={"plan_routes_file": str(path),
                                                             "instance_type": "ml.g5.2xlarge"})
    assert bigger.returncode == 0, bigger.stderr
    assert ("fleet replaced because EndpointConfig ProductionVariants[0].InstanceType: ml.g5.xlarge -> "
            "ml.g5.2xlarge") in bigger.stderr
    path.write_bytes(b"{")
    broken = here("app.py", outdir=tmp_path / "c", settings={"plan_routes_file": str(path)})
    assert broken.returncode == 1 and "error: routes" in broken.stderr and "Traceback" not in broken.stderr


@pytest.mark.parametrize(("names", "refused"), [(["bert", "Bert"], "Bert"), (["_routes"], "_routes"),
                                                (["served", "served"], "served")])
def test_names_that_could_collide_are_refused_before_any_build(names: list[str], refused: str) -> None:
    """Logical names are lowercase and start with a letter or digit (``MODEL_NAME_PATTERN``): two
    names that differ only in case, or a bookkeeping name (``_routes``, ``_releases``), cannot be
    written; a name twice is refused; each names the entry."""
    from triton_mme_cdk.model_build.errors import ManifestError
    from triton_mme_cdk.model_build.manifest import parse_manifest

    with pytest.raises(ManifestError) as caught:
        parse_manifest({"version": 1, "models": [_entry(name, i) for i, name in enumerate(names)]})
    assert repr(refused) in str(caught.value) or refused in str(caught.value)
