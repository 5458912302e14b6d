"""``pr-fetch``: bring the template a pull request's own code synthesized to the gate, as data.

Why: the gate (``.github/workflows/triton-mme-plan.yml``) runs the base branch's code only. The
pull request's code synthesizes its template in another workflow (``triton-mme-synth.yml``, on
``pull_request``: no AWS credentials, a read-only token) and keeps it as the artifact
``triton-mme-template``. This command finds that artifact through GitHub's REST API and unpacks it
into ``--out``, treating it as untrusted data:

- the run: ``--run-id`` (the ``workflow_run`` that finished; it must be a ``pull_request`` run that
  succeeded), or ``--pr`` (an approval comment: the newest successful run of ``--workflow`` for the
  pull request's head commit);
- the pull request: its number comes from the artifact (``pr.json``; a fork's run does not carry
  it), and is believed only when GitHub says that pull request is open with the run's head commit;
- the zip: at most :data:`ZIP_LIMIT` bytes; only the members of :data:`MEMBERS`, each under its
  own limit, plain files at the top level (no folder, no ``..``, no link, no name twice); each is
  written under its own fixed name in ``--out``, never a name the zip gives. Nothing in it is run:
  the gate reads ``template.json`` as JSON and ``manifest.yaml`` as the manifest.

It writes ``pr``, ``head_sha``, ``run_id`` and ``manifest`` (``true`` when the pull request has a
manifest) to ``$GITHUB_OUTPUT`` when set, and prints them. Its API calls: ``GET
/actions/runs/{id}``, ``GET /actions/workflows/{file}/runs``, ``GET /actions/runs/{id}/artifacts``,
``GET /actions/artifacts/{id}/zip`` (a redirect, followed without the token) and ``GET
/pulls/{n}``; the job needs ``actions: read`` and ``pull-requests: read``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.tools.review.github_api import GitHub

ARTIFACT = "triton-mme-template"
WORKFLOW = "triton-mme-synth.yml"
#: The zip's members and the most bytes each may hold unpacked. A template CloudFormation takes is
#: at most 1 MB (from S3); a manifest of thousands of models a few MB.
MEMBERS = {"template.json": 8 << 20, "manifest.yaml": 8 << 20, "pr.json": 4 << 10}
REQUIRED = ("template.json", "pr.json")
#: The most bytes the artifact's zip may have.
ZIP_LIMIT = 16 << 20
SHA_PATTERN = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Fetched:
    pr: int
    head_sha: str
    run_id: int
    manifest: bool


def _sha(value: Any, where: str) -> str:
    if not isinstance(value, str) or not SHA_PATTERN.fullmatch(value):
        raise ModelBuildError(f"pr-fetch: {where}: got {value!r}; expected a commit SHA (40 hex digits)")
    return value


def newest_run(github: GitHub, workflow: str, head_sha: str) -> dict[str, Any]:
    """The newest successful ``pull_request`` run of ``workflow`` for ``head_sha``."""
    runs = [run for run in github.pages(f"/actions/workflows/{workflow}/runs?head_sha={head_sha}"
                                        "&event=pull_request&status=success", "workflow_runs")
            if run.get("head_sha") == head_sha and run.get("conclusion") == "success"]
    if not runs:
        raise ModelBuildError(f"pr-fetch: no successful run of {workflow} for commit {head_sha} yet; the gate runs "
                              "again when it finishes")
    return max(runs, key=lambda run: int(run["id"]))


def unpack(data: bytes, out: Path) -> list[str]:
    """Check the artifact's zip (see the module's docstring) and write its members into ``out``;
    the names written."""
    if len(data) > ZIP_LIMIT:
        raise ModelBuildError(f"pr-fetch: the artifact is {len(data)} bytes; at most {ZIP_LIMIT} are taken")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except (zipfile.BadZipFile, ValueError) as error:
        raise ModelBuildError(f"pr-fetch: the artifact is not a zip ({error})") from None
    allowed = ", ".join(MEMBERS)
    seen: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        name = info.filename
        if name not in MEMBERS:
            raise ModelBuildError(f"pr-fetch: the artifact holds {name!r}; only {allowed} are taken (plain files at "
                                  "its top level)")
        if name in seen:
            raise ModelBuildError(f"pr-fetch: the artifact holds {name!r} twice")
        kind = stat.S_IFMT(info.external_attr >> 16)  # 0: the zip says nothing (permissions alone)
        if info.is_dir() or kind not in (0, stat.S_IFREG):
            raise ModelBuildError(f"pr-fetch: the artifact's {name!r} is not a plain file")
        if info.file_size > MEMBERS[name]:
            raise ModelBuildError(f"pr-fetch: the artifact's {name!r} is {info.file_size} bytes; at most "
                                  f"{MEMBERS[name]} are taken")
        seen[name] = info
    missing = [name for name in REQUIRED if name not in seen]
    if missing:
        raise ModelBuildError(f"pr-fetch: the artifact has no {' and no '.join(missing)}")
    out.mkdir(parents=True, exist_ok=True)
    for name in MEMBERS:  # an earlier fetch's files are not this artifact's
        (out / name).unlink(missing_ok=True)
    for name, info in seen.items():
        try:
            with archive.open(info) as member:
                content = member.read(MEMBERS[name] + 1)  # the header's size is the zip's word: read no more
        except (zipfile.BadZipFile, OSError, RuntimeError) as error:
            raise ModelBuildError(f"pr-fetch: the artifact's {name!r} cannot be read ({error})") from None
        if len(content) > MEMBERS[name]:
            raise ModelBuildError(f"pr-fetch: the artifact's {name!r} unpacks past {MEMBERS[name]} bytes; refused")
        with open(out / name, "xb") as handle:  # a fixed name of MEMBERS, never a path from the zip
            handle.write(content)
    return sorted(seen)


def _pr_of(out: Path) -> int:
    try:
        number = json.loads((out / "pr.json").read_bytes()).get("number")
    except (ValueError, AttributeError):
        number = None
    if not isinstance(number, int) or isinstance(number, bool) or number <= 0:
        raise ModelBuildError("pr-fetch: the artifact's pr.json gives no pull request number ({\"number\": N})")
    return number


def fetch(github: GitHub, out: Path, *, run_id: int | None = None, pr: int | None = None,
          workflow: str = WORKFLOW, artifact: str = ARTIFACT) -> Fetched:
    """The artifact of the run (``run_id``) or of the pull request's head (``pr``), unpacked into ``out``."""
    expected_pr = pr
    if run_id is not None:
        run = github.get(f"/actions/runs/{run_id}")
        if run.get("event") != "pull_request" or run.get("conclusion") != "success":
            raise ModelBuildError(f"pr-fetch: run {run_id} is a {run.get('event')!r} run that ended "
                                  f"{run.get('conclusion')!r}; only a pull_request run that succeeded is planned")
        head_sha = _sha(run.get("head_sha"), f"run {run_id}'s head_sha")
    else:
        assert pr is not None
        pull = github.get(f"/pulls/{pr}")
        head_sha = _sha((pull.get("head") or {}).get("sha"), f"pull request {pr}'s head sha")
        run = newest_run(github, workflow, head_sha)
    found = [item for item in github.pages(f"/actions/runs/{run['id']}/artifacts", "artifacts")
             if item.get("name") == artifact and not item.get("expired")]
    if len(found) != 1:
        raise ModelBuildError(f"pr-fetch: run {run['id']} has {len(found)} artifacts named {artifact!r}; expected one")
    size = found[0].get("size_in_bytes")
    if not isinstance(size, int) or size > ZIP_LIMIT:
        raise ModelBuildError(f"pr-fetch: the artifact {artifact!r} is {size} bytes; at most {ZIP_LIMIT} are taken")
    names = unpack(github.download(f"/actions/artifacts/{int(found[0]['id'])}/zip", ZIP_LIMIT), out)
    number = _pr_of(out)
    if expected_pr is not None and number != expected_pr:
        raise ModelBuildError(f"pr-fetch: the artifact of run {run['id']} is for pull request {number}, not {expected_pr}")
    pull = github.get(f"/pulls/{number}")
    if pull.get("state") != "open" or (pull.get("head") or {}).get("sha") != head_sha:
        raise ModelBuildError(f"pr-fetch: pull request {number} is {pull.get('state')!r} with head "
                              f"{(pull.get('head') or {}).get('sha')!r}, not open at {head_sha} (the artifact names "
                              "another pull request, or a newer push superseded this run: its own run plans it)")
    return Fetched(pr=number, head_sha=head_sha, run_id=int(run["id"]), manifest="manifest.yaml" in names)


def cmd_pr_fetch(args: argparse.Namespace) -> int:
    github = GitHub.from_environment("pr-fetch", "`actions: read` and `pull-requests: read`")
    fetched = fetch(github, Path(args.out), run_id=args.run_id, pr=args.pr, workflow=args.workflow,
                    artifact=args.artifact)
    lines = [f"pr={fetched.pr}", f"head_sha={fetched.head_sha}", f"run_id={fetched.run_id}",
             f"manifest={'true' if fetched.manifest else 'false'}"]
    print("pr-fetch: " + " ".join(lines))
    if os.environ.get("GITHUB_OUTPUT"):  # the step's outputs, for the steps after it
        with open(os.environ["GITHUB_OUTPUT"], "a", encoding="utf-8") as handle:
            handle.writelines(f"{line}\n" for line in lines)
    return 0


def add_pr_fetch_parser(sub: Any) -> None:
    parser = sub.add_parser("pr-fetch", help="unpack the template a pull request synthesized (its run's artifact), "
                                             "as untrusted data (GitHub)",
                            description=__doc__.split("\n\n")[1].replace("\n", " "))
    parser.set_defaults(func=cmd_pr_fetch)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--run-id", type=int, default=None, help="the synth run (a workflow_run's id)")
    which.add_argument("--pr", type=int, default=None, help="the pull request (its head's newest synth run)")
    parser.add_argument("--out", required=True, help="the folder to unpack into (template.json, manifest.yaml, pr.json)")
    parser.add_argument("--workflow", default=WORKFLOW, help=f"the synth workflow's file (default: {WORKFLOW})")
    parser.add_argument("--artifact", default=ARTIFACT, help=f"the artifact's name (default: {ARTIFACT})")
