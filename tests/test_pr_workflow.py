"""The pull-request workflow (.github/workflows/triton-mme-plan.yml) runs as written.

Its own ``run:`` scripts, read from the workflow file (not copied here), run on this checkout with
what GitHub Actions would give them: the plan step against a routes file and a deployed template,
its ``exit_code`` output through ``$GITHUB_OUTPUT``; the comment step against a GitHub REST API
on loopback (a small real HTTP server keeping comments), twice, leaving one comment that the
second push updated; the gate with and without the allowing label. The steps that are actions
(checkout, setup-python, credentials, artifact upload) are GitHub's and are not run here.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from cdk_helpers import subprocess_env, synth
from test_plan import _routes

from triton_mme_cdk.model_build.release import model_code_sha256
from triton_mme_cdk.model_build.release.deployed import record_from_template
from triton_mme_cdk.model_build.tools.plan_report import marker

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "triton-mme-plan.yml"


def _job() -> dict[str, Any]:
    workflow = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    job: dict[str, Any] = workflow["jobs"]["plan"]
    return job


def _step(name: str) -> dict[str, Any]:
    step: dict[str, Any] = next(step for step in _job()["steps"] if step.get("name") == name)
    return step


def _run(name: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """One ``run:`` step as Actions runs it (``bash -e {0}``), with the job's and the step's env
    replaced by ``env`` (their ``${{ }}`` expressions are what GitHub fills in)."""
    script = _step(name)["run"]
    assert "${{" not in script, f"step {name!r}: expressions belong in its env, not in the script"
    return subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=subprocess_env(**env), capture_output=True,
                          text=True, timeout=300)


class _GitHub(BaseHTTPRequestHandler):
    """The issue-comments part of GitHub's REST API, kept in memory."""

    comments: ClassVar[dict[int, dict[str, Any]]] = {}
    calls: ClassVar[list[str]] = []

    def _reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        body: dict[str, Any] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        return body

    def do_GET(self) -> None:
        self.calls.append(f"GET {self.path}")
        assert self.headers["Authorization"] == "Bearer token-1"
        query = parse_qs(urlsplit(self.path).query)
        page, size = int(query.get("page", ["1"])[0]), int(query.get("per_page", ["30"])[0])
        items = sorted(self.comments.values(), key=lambda item: item["id"])
        self._reply(200, items[(page - 1) * size:page * size])

    def do_POST(self) -> None:
        self.calls.append(f"POST {self.path}")
        comment = {"id": 1000 + len(self.comments), "body": self._body()["body"]}
        self.comments[comment["id"]] = comment
        self._reply(201, comment)

    def do_PATCH(self) -> None:
        self.calls.append(f"PATCH {self.path}")
        comment_id = int(self.path.rsplit("/", 1)[1])
        self.comments[comment_id]["body"] = self._body()["body"]
        self._reply(200, self.comments[comment_id])

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def github() -> Iterator[str]:
    _GitHub.comments, _GitHub.calls = {1: {"id": 1, "body": "an earlier review comment"}}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _GitHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_docs_show_the_workflow_as_it_is() -> None:
    docs = (ROOT / "docs" / "pipelines.md").read_text(encoding="utf-8")
    assert "```yaml\n" + WORKFLOW.read_text(encoding="utf-8") + "```" in docs


@pytest.mark.slow
def test_the_workflow_plans_comments_once_and_gates_on_exit_4(tmp_path: Path, github: str) -> None:
    job = _job()
    assert job["env"]["ALLOW_LABEL"] == "fleet-replacement-approved"
    assert "--stack-name" in job["env"]["PLAN_LIVE"] and "--bucket" in job["env"]["PLAN_LIVE"]
    steps = [step.get("name") or step.get("uses") for step in job["steps"]]
    assert steps.index("Plan") < steps.index("Comment") < steps.index("Gate")
    # The live state as the routes file and deployed template a stack would have.
    deployed = synth(tmp_path / "synth", nag=False).data
    (tmp_path / "deployed.json").write_text(json.dumps(deployed))
    checkout = tmp_path / "checkout"
    subprocess.run(["git", "clone", "--quiet", "--shared", str(ROOT), str(checkout)], check=True)
    # The routes as the checkout's build code wrote them (the working tree may hold edits not committed).
    routes = tmp_path / "routes.json"
    routes.write_bytes(_routes(deployed=record_from_template(deployed),
                               code_sha256=model_code_sha256(checkout / "model_build")).body())
    # The checkout uses this machine's environments (what `make plan-setup` installs there).
    for name in (".venv", "node_modules"):
        (checkout / name).symlink_to(ROOT / name)
    live = f"--routes-file {routes} --deployed-template {tmp_path / 'deployed.json'}"

    def plan(*extra: str) -> str:
        output = tmp_path / "github_output"
        output.write_text("")
        result = _run("Plan", checkout, PLAN_LIVE=" ".join([live, *extra]), GITHUB_OUTPUT=str(output))
        assert result.returncode == 0, result.stdout + result.stderr
        (line,) = output.read_text().splitlines()
        return line.removeprefix("exit_code=")

    def comment() -> None:
        result = _run("Comment", checkout, GITHUB_TOKEN="token-1", PR_NUMBER="7", GITHUB_API_URL=github,
                      GITHUB_REPOSITORY="acme/models")
        assert result.returncode == 0, result.stdout + result.stderr

    def gate(code: str, labels: str) -> subprocess.CompletedProcess[str]:
        return _run("Gate", checkout, PLAN_EXIT=code, LABELS=labels, ALLOW_LABEL=job["env"]["ALLOW_LABEL"])

    # First push: nothing changes; the plan is posted once.
    assert plan() == "0"
    comment()
    assert gate("0", "").returncode == 0
    # Second push: a bigger instance type, given as the settings the PR changes: the same comment,
    # updated; the gate stops until the label allows it.
    assert plan("-c", "mme:instance_type=ml.g5.2xlarge") == "4"
    comment()
    ours = [c for c in _GitHub.comments.values() if c["body"].startswith(marker("TritonMme"))]
    assert len(ours) == 1 and len(_GitHub.comments) == 2, "one plan comment, the other comment untouched"
    assert "fleet replaced because EndpointConfig ProductionVariants[0].InstanceType" in ours[0]["body"]
    assert [call.split(" ")[0] for call in _GitHub.calls] == ["GET", "POST", "GET", "PATCH"]
    assert (checkout / "plan.json").is_file() and json.loads((checkout / "plan.json").read_text())["exit_code"] == 4
    stopped = gate("4", "documentation")
    assert stopped.returncode == 1 and "add the label fleet-replacement-approved" in stopped.stdout
    assert gate("4", "documentation,fleet-replacement-approved").returncode == 0
    assert gate("3", "").returncode == 0
    # A plan that fails (a broken routes file) fails its step with the error line, and posts nothing.
    routes.write_bytes(routes.read_bytes()[:50])
    output = tmp_path / "github_output"
    output.write_text("")
    failed = _run("Plan", checkout, PLAN_LIVE=live, GITHUB_OUTPUT=str(output))
    assert failed.returncode == 1 and "truncated" in failed.stderr and output.read_text() == "exit_code=1\n"


def test_pr_comment_refuses_what_it_cannot_post(tmp_path: Path, github: str) -> None:
    """No token, no marker line, no such file: one line each, exit 1, nothing posted."""
    plan = tmp_path / "plan.md"
    plan.write_text("no marker here\n")
    cases = [
        ({"GITHUB_REPOSITORY": "acme/models"}, ["--file", str(plan), "--pr", "7"], "GITHUB_TOKEN not set"),
        ({"GITHUB_TOKEN": "token-1", "GITHUB_REPOSITORY": "acme/models", "GITHUB_API_URL": github},
         ["--file", str(plan), "--pr", "7"], "does not start with the plan's hidden marker line"),
        ({"GITHUB_TOKEN": "token-1", "GITHUB_REPOSITORY": "acme/models"}, ["--file", str(tmp_path / "nope.md"),
                                                                            "--pr", "7"], "--file: got"),
    ]
    for env, args, expected in cases:
        result = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "model_build", "pr-comment", *args],
                                cwd=ROOT, env={k: v for k, v in subprocess_env(**env).items()
                                               if k != "GITHUB_TOKEN" or "GITHUB_TOKEN" in env},
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 1 and expected in result.stdout + result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert _GitHub.calls == [] and len(_GitHub.comments) == 1
