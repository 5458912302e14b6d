"""The pull-request gate's commands against GitHub's REST API on loopback (``tests/github_fake.py``).

``plan``'s digest (what changes it and what does not; the schema), ``pr-gate`` (an approval counts
only from a writer who is not the author, unedited, naming this plan's digest; the commit status it
sets), ``pr-fetch`` (the synth run's artifact as untrusted data: the redirect followed without the
token, members and sizes refused, the pull request checked against the run's head) and
``pr-comment`` (only its own bot's comment is edited). Each command runs as the workflow runs it,
``python -m model_build ...`` in a new process. The end-to-end run of the workflows' own scripts on
real synthesized templates is ``tests/test_pr_workflow.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from github_fake import APP, APP_TOKEN, BOT, TOKEN, State, env, serve, user

from triton_mme_cdk.model_build.release.routes import ModelPlan, Route
from triton_mme_cdk.model_build.tools.review.plan_report import PlanReport, marker, plan_digest
from triton_mme_cdk.model_build.tools.review.plan_verdict import Finding, Verdict

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "model_build" / "tools" / "review" / "plan.schema.json").read_text())
HEAD, HEAD2 = "a" * 40, "b" * 40


def _report(instance_type: str = "ml.g5.2xlarge", *, unchanged: int = 0, data: str = "safe",
            findings: list[Finding] | None = None, fleet: str = "") -> PlanReport:
    """A plan as ``plan`` builds it: an instance type other than ml.g5.xlarge replaces the fleet
    (exit 4); ``fleet`` other than ``replaced`` gives that verdict with no finding."""
    replaced = Finding(kind="fleet-replaced", name="EndpointConfig", logical_id="EndpointConfig1",
                       resource_type="AWS::SageMaker::EndpointConfig", impact="WILL_REPLACE",
                       reasons=(f"ProductionVariants[0].InstanceType: ml.g5.xlarge -> {instance_type}",))
    fleet = fleet or ("replaced" if instance_type != "ml.g5.xlarge" else "unchanged")
    verdict = Verdict(fleet=fleet, data=data, compared_with="the deployed template deployed.json", others_compared=True,
                      findings=findings if findings is not None else ([replaced] if fleet == "replaced" else []))
    routes = [Route(logical_name=f"m{i}", target_model=f"m{i}-{'0' * 12}.tar.gz", sha256="0" * 64, size=1,
                    model_key="k-" + "0" * 32, source_model="x") for i in range(unchanged)]
    return PlanReport(stack="TritonMme", models=ModelPlan(unchanged=routes, live_release="r-0123456789abcdef"),
                      verdict=verdict, routes_where="routes.json")


def _cli(*args: str, **environment: str) -> subprocess.CompletedProcess[str]:
    """``python -m model_build ARGS`` in the checkout (as the workflow runs it), with only ``environment``'s
    GitHub variables."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    return subprocess.run([sys.executable, "-m", "model_build", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**base, **environment})


@pytest.fixture
def github() -> Iterator[tuple[State, str]]:
    state = State()
    with serve(state) as api:
        yield state, api


# ---------------------------------------------------------------------------------------------
# The digest
# ---------------------------------------------------------------------------------------------


def test_the_digest_is_the_verdict_and_findings_and_nothing_else() -> None:
    plan = _report().as_json()
    jsonschema.validate(plan, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert plan["digest"] == plan_digest(plan) and plan["digest"].startswith("sha256:")
    # The models (no exit code depends on them), the texts and the files compared are not hashed.
    assert _report(unchanged=3).as_json()["digest"] == plan["digest"]
    moved = {**plan, "compared_with": {"routes": "elsewhere.json", "deployed": "x"}, "summary": "other words"}
    assert plan_digest(moved) == plan["digest"]
    # The order findings come in is not the plan: the same findings in another order hash the same.
    two = [Finding(kind="other", name=f"Thing {i}", logical_id=f"Thing{i}", resource_type="AWS::SNS::Topic",
                   impact="WILL_UPDATE", reasons=(f"DisplayName: a -> {i}",)) for i in range(2)]
    assert (_report(findings=two).as_json()["digest"] == _report(findings=two[::-1]).as_json()["digest"])
    # A finding's reason, the verdict or the data verdict changed: another digest.
    assert _report("ml.g5.4xlarge").as_json()["digest"] != plan["digest"]
    assert _report(data="at-risk").as_json()["digest"] != plan["digest"]
    assert _report("ml.g5.xlarge").as_json()["digest"] != plan["digest"]
    # Shown where a person reads it.
    report = _report()
    assert f"Plan digest: `{plan['digest']}`" in report.markdown()
    assert f"digest: {plan['digest']}" in report.text().splitlines()


# ---------------------------------------------------------------------------------------------
# pr-gate
# ---------------------------------------------------------------------------------------------


def _gate(tmp_path: Path, api: str, plan: dict[str, Any], *, pr: int = 7, head: str = HEAD,
          markdown: str | None = None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    extra = []
    if markdown is not None:
        (tmp_path / "plan.md").write_text(markdown)
        extra = ["--markdown-file", str(tmp_path / "plan.md")]
    return _cli("pr-gate", "--plan", str(tmp_path / "plan.json"), "--pr", str(pr), "--head-sha", head, *extra,
                "--identity", APP["login"], **_app_env(api, GITHUB_RUN_ID="99", GITHUB_SERVER_URL="https://github.example"))


def _app_env(api: str, **extra: str) -> dict[str, str]:
    """What the Gate step is given: the gate's own app's token."""
    return {**env(api, **extra), "GITHUB_TOKEN": APP_TOKEN}


def test_a_plan_that_needs_nobody_passes_and_sets_the_status(tmp_path: Path, github: tuple[State, str]) -> None:
    state, api = github
    plans = [_report(fleet="unchanged").as_json(), _report(fleet="updated").as_json()]
    assert [(plan["verdict"], plan["exit_code"]) for plan in plans] == [("no-change", 0), ("fleet-updated", 3)]
    for plan in plans:
        result = _gate(tmp_path, api, plan)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"plan exit {plan['exit_code']} ({plan['verdict']}): nothing that needs a person" in result.stdout
    assert [(sha, status["state"], status["context"]) for sha, status in state.statuses] == [
        (HEAD, "success", "triton-mme/plan-approval")] * 2
    assert state.statuses[0][1]["target_url"] == "https://github.example/acme/models/actions/runs/99"
    assert not any("/comments" in call for call in state.calls), "no comment read when nobody is needed"


def test_exit_4_needs_an_approval_of_its_digest(tmp_path: Path, github: tuple[State, str]) -> None:
    state, api = github
    state.pull(7, "bob", HEAD)
    state.permissions.update({"alice": {"permission": "write", "role_name": "maintain"},
                              "bob": {"permission": "admin", "role_name": "admin"},
                              "carol": {"permission": "read", "role_name": "triage"},
                              "dave": {"permission": "write", "role_name": "write"}})
    plan = _report().as_json()
    digest = plan["digest"]
    assert plan["exit_code"] == 4

    def gate(markdown: str | None = None) -> subprocess.CompletedProcess[str]:
        return _gate(tmp_path, api, plan, markdown=markdown)

    # No approval: stopped, with the one line to approve it.
    stopped = gate("# plan\n")
    assert stopped.returncode == 1 and f"comments `/approve-plan {digest}`" in stopped.stdout
    assert state.statuses[-1][1]["state"] == "failure"
    assert "**Gate:** ⛔ plan exit 4 (fleet-replaced) needs a person" in (tmp_path / "plan.md").read_text()
    # Refused, each with its reason: the author (even an admin), a triage member, a stranger, a bot,
    # an edited comment, a look-alike line inside other text.
    state.comment(7, f"/approve-plan {digest}", user("bob"))
    state.comment(7, f"LGTM\n/approve-plan {digest}\n", user("carol"))
    state.comment(7, f"/approve-plan {digest}", user("eve"))
    state.comment(7, f"/approve-plan {digest}", user("helper-app[bot]", "Bot"))
    state.comment(7, f"/approve-plan {digest}", user("dave"), edited=True)
    state.comment(7, f"please /approve-plan {digest}", user("alice"))
    stopped = gate()
    assert stopped.returncode == 1, stopped.stdout
    out = stopped.stdout
    assert "@bob is the pull request's author, who cannot approve its plan" in out
    assert "@carol's permission on the repository is 'triage'; write, maintain or admin is needed" in out
    assert "@eve's permission on the repository is 'none (not a collaborator)'" in out
    assert "a Bot account, not a person" in out
    assert "@dave (comment" in out and "edited after it was posted" in out
    assert "@alice" not in out, "a line that is not the approval line alone is no approval"
    assert state.statuses[-1][1]["state"] == "failure"
    # A writer who is not the author approves this digest: passed, and the status says who.
    state.comment(7, f"/approve-plan {digest}", user("alice"))
    passed = gate("# plan\n")
    assert passed.returncode == 0, passed.stdout
    assert f"approved by @alice for {digest}" in passed.stdout
    assert state.statuses[-1] == (HEAD, {"state": "success", "context": "triton-mme/plan-approval",
                                         "description": "approved by @alice",
                                         "target_url": "https://github.example/acme/models/actions/runs/99"})
    assert "**Gate:** ✅" in (tmp_path / "plan.md").read_text()
    # A push that changes the plan: alice's approval names the old digest; the gate names both.
    state.pull(7, "bob", HEAD2)
    changed = _report("ml.g5.4xlarge").as_json()
    stopped = _gate(tmp_path, api, changed, head=HEAD2)
    assert stopped.returncode == 1
    assert f"it names plan {digest}; this plan is {changed['digest']} (a push changed the plan)" in stopped.stdout
    assert state.statuses[-1][0] == HEAD2 and state.statuses[-1][1]["state"] == "failure"
    # A push that leaves the plan the same (the models aside): alice's approval still holds.
    same = _report(unchanged=4).as_json()
    assert same["digest"] == digest
    held = _gate(tmp_path, api, same, head=HEAD2)
    assert held.returncode == 0 and "approved by @alice" in held.stdout


def test_the_gate_refuses_a_plan_file_it_cannot_trust(tmp_path: Path, github: tuple[State, str]) -> None:
    state, api = github
    plan = _report().as_json()
    tampered = {**plan, "exit_code": 3}  # a plan edited after plan wrote it
    result = _gate(tmp_path, api, tampered)
    assert result.returncode == 1 and f"digest '{plan['digest']}' is not its content's" in result.stderr
    assert "Traceback" not in result.stderr
    (tmp_path / "plan.json").unlink()
    missing = _cli("pr-gate", "--plan", str(tmp_path / "plan.json"), "--pr", "7", "--head-sha", HEAD,
                   "--identity", APP["login"], **_app_env(api))
    assert missing.returncode == 1 and "no such file (the plan step failed" in missing.stderr
    assert [status["state"] for _, status in state.statuses] == ["failure", "failure"]
    assert state.statuses[-1][1]["description"] == "the plan did not run: see the run's log"
    bad_sha = _cli("pr-gate", "--plan", str(tmp_path / "plan.json"), "--pr", "7", "--head-sha", "main",
                   "--identity", APP["login"], **_app_env(api))
    assert bad_sha.returncode == 1 and "--head-sha: got 'main'; expected a commit SHA" in bad_sha.stderr


def test_the_gate_refuses_a_check_set_by_another_identity(tmp_path: Path, github: tuple[State, str]) -> None:
    """Any branch's workflow can post the check with its GITHUB_TOKEN (as github-actions[bot]): a
    status of the gate's context set by anyone but the gate's app, or a check run of that name,
    stops the pull request, each named, even on a plan that needs nobody; the gate's own earlier
    status is not refused."""
    state, api = github
    plan = _report(fleet="unchanged").as_json()
    assert plan["exit_code"] == 0
    ours = _gate(tmp_path, api, plan)
    assert ours.returncode == 0, ours.stdout + ours.stderr
    assert state.status_records[-1]["creator"] == APP
    again = _gate(tmp_path, api, plan)  # its own status of the last run is not another identity's
    assert again.returncode == 0, again.stdout + again.stderr
    forged = state.status(HEAD, {"state": "success", "context": "triton-mme/plan-approval",
                                 "description": "looks fine"}, BOT)
    stopped = _gate(tmp_path, api, plan, markdown="# plan\n")
    assert stopped.returncode == 1, stopped.stdout
    assert (f"status triton-mme/plan-approval = success (id {forged['id']}) set by @github-actions[bot], not by the "
            "gate's app @triton-mme-gate[bot]: refused") in stopped.stdout
    assert "Traceback" not in stopped.stderr
    last = state.status_records[-1]
    assert (last["state"], last["creator"]) == ("failure", APP)
    assert last["description"].startswith("the check triton-mme/plan-approval was also set by another identity")
    assert "set by @github-actions[bot]" in (tmp_path / "plan.md").read_text()
    # A check run of the same name (which a required check also accepts) from another app.
    state.status_records[:] = [r for r in state.status_records if r["creator"] == APP]
    state.check_run(HEAD, "triton-mme/plan-approval", "some-ci")
    state.check_run(HEAD, "lint", "some-ci")
    stopped = _gate(tmp_path, api, plan)
    assert stopped.returncode == 1, stopped.stdout
    assert "check run triton-mme/plan-approval = success (id 7000) set by the app 'some-ci'" in stopped.stdout
    assert "lint" not in stopped.stdout
    # Another commit's statuses are not this one's.
    state.check_runs.clear()
    state.status(HEAD2, {"state": "success", "context": "triton-mme/plan-approval"}, BOT)
    assert _gate(tmp_path, api, plan).returncode == 0


def test_the_gate_runs_only_as_its_own_app(tmp_path: Path, github: tuple[State, str]) -> None:
    """github-actions[bot] is every workflow's identity: refused as --identity before any call; a
    token that is not the app's (GitHub records another creator) is an error naming both."""
    state, api = github
    plan = _report(fleet="unchanged").as_json()
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    args = ["pr-gate", "--plan", str(tmp_path / "plan.json"), "--pr", "7", "--head-sha", HEAD]
    refused = _cli(*args, "--identity", "github-actions[bot]", **_app_env(api))
    assert refused.returncode == 1 and "--identity: got 'github-actions[bot]'; expected the bot login" in refused.stderr
    assert "Traceback" not in refused.stderr and state.calls == []
    wrong = _cli(*args, "--identity", APP["login"], **{**env(api), "GITHUB_TOKEN": TOKEN})
    assert wrong.returncode == 1, wrong.stdout
    assert ("GitHub recorded the status as set by @github-actions[bot], not by --identity @triton-mme-gate[bot]"
            in wrong.stderr), wrong.stderr
    assert "Traceback" not in wrong.stderr


# ---------------------------------------------------------------------------------------------
# pr-fetch
# ---------------------------------------------------------------------------------------------

TEMPLATE = json.dumps({"Resources": {}}).encode()


def _fetch(tmp_path: Path, api: str, *args: str) -> subprocess.CompletedProcess[str]:
    output = tmp_path / "github_output"
    output.write_text("")
    return _cli("pr-fetch", "--out", str(tmp_path / "pr"), *args, **env(api, GITHUB_OUTPUT=str(output)))


def test_pr_fetch_unpacks_the_run_artifact(tmp_path: Path, github: tuple[State, str]) -> None:
    state, api = github
    state.pull(7, "bob", HEAD)
    state.run(11, HEAD, {"template.json": TEMPLATE, "manifest.yaml": b"version: 1\nmodels: []\n",
                         "pr.json": b'{"number": 7}'})
    result = _fetch(tmp_path, api, "--run-id", "11")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "github_output").read_text() == f"pr=7\nhead_sha={HEAD}\nrun_id=11\nmanifest=true\n"
    assert (tmp_path / "pr" / "template.json").read_bytes() == TEMPLATE
    assert sorted(p.name for p in (tmp_path / "pr").iterdir()) == ["manifest.yaml", "pr.json", "template.json"]
    # From a comment: the newest successful synth run of the pull request's head.
    state.run(12, HEAD, {"template.json": b'{"Resources": {"A": {}}}', "pr.json": b'{"number": 7}'})
    state.run(13, HEAD, {"template.json": b"{}", "pr.json": b'{"number": 7}'}, conclusion="failure")
    state.run(14, HEAD2, {"template.json": b"{}", "pr.json": b'{"number": 7}'})
    result = _fetch(tmp_path, api, "--pr", "7")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "run_id=12" in (tmp_path / "github_output").read_text()
    assert "manifest=false" in (tmp_path / "github_output").read_text()
    assert json.loads((tmp_path / "pr" / "template.json").read_text()) == {"Resources": {"A": {}}}
    assert not (tmp_path / "pr" / "manifest.yaml").exists(), "the earlier fetch's manifest is not this run's"
    # The zip came from storage, through GitHub's redirect, without the token (the storage refuses it).
    assert sum(call.startswith("STORAGE GET /storage/") for call in state.calls) == 2


def test_pr_fetch_refuses_what_it_cannot_trust(tmp_path: Path, github: tuple[State, str]) -> None:
    """Each refusal is one line, exit 1, and nothing is written outside --out."""
    state, api = github
    state.pull(7, "bob", HEAD)
    state.pull(8, "mallory", HEAD2)
    good = {"template.json": TEMPLATE, "pr.json": b'{"number": 7}'}
    cases: list[tuple[dict[str, bytes] | bytes, str, str]] = [
        ({**good, "../escape.json": b"{}"}, "holds '../escape.json'; only template.json, manifest.yaml, pr.json", ""),
        ({**good, "run.sh": b"#!/bin/sh\n"}, "holds 'run.sh'", ""),
        ({**good, "sub/template.json": b"{}"}, "holds 'sub/template.json'", ""),
        ({"template.json": TEMPLATE}, "has no pr.json", ""),
        ({"template.json": b" " * (8 << 20 | 1), "pr.json": b'{"number": 7}'}, "'template.json' is 8388609 bytes", ""),
        (b"not a zip at all", "the artifact is not a zip", ""),
        ({"template.json": TEMPLATE, "pr.json": b'{"number": 8}'}, "pull request 8 is 'open' with head", ""),
        ({"template.json": TEMPLATE, "pr.json": b'{"number": "7; rm -rf /"}'}, "gives no pull request number", ""),
        (good, "run 29 is a 'push' run", "push"),
    ]
    for index, (files, expected, event) in enumerate(cases):
        run_id = 21 + index
        if isinstance(files, bytes):
            state.run(run_id, HEAD, raw=files)
        else:
            state.run(run_id, HEAD, files, event=event or "pull_request")
        result = _fetch(tmp_path, api, "--run-id", str(run_id))
        assert result.returncode == 1 and expected in result.stderr, (expected, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        assert (tmp_path / "github_output").read_text() == ""
    assert not (tmp_path / "escape.json").exists()
    # A link inside the zip: refused as not a plain file.
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("pr.json", b'{"number": 7}')
        link = zipfile.ZipInfo("template.json")
        link.external_attr = (0o120777 << 16)
        archive.writestr(link, "/etc/passwd")
    state.run(40, HEAD, raw=buffer.getvalue())
    result = _fetch(tmp_path, api, "--run-id", "40")
    assert result.returncode == 1 and "'template.json' is not a plain file" in result.stderr


# ---------------------------------------------------------------------------------------------
# pr-comment
# ---------------------------------------------------------------------------------------------


def test_pr_comment_edits_only_its_own_bots_comment(tmp_path: Path, github: tuple[State, str]) -> None:
    state, api = github
    head = marker("TritonMme")
    state.comment(7, f"{head}\nlooks like the plan, written by a person", user("mallory"))
    state.comment(7, f"{head}\nanother app's comment", user("other-app[bot]", "Bot"))
    state.comment(7, "an earlier review comment", user("alice"))
    before = {cid: dict(c) for cid, c in state.comments.items()}
    plan = tmp_path / "plan.md"

    def post(text: str) -> subprocess.CompletedProcess[str]:
        plan.write_text(f"{head}\n{text}\n")
        return _cli("pr-comment", "--file", str(plan), "--pr", "7", **env(api))

    first = post("first push")
    assert first.returncode == 0 and "created comment" in first.stdout, first.stdout + first.stderr
    second = post("second push")
    assert second.returncode == 0 and "updated comment" in second.stdout
    (ours,) = state.ours(7)
    assert ours["body"] == f"{head}\nsecond push\n"
    assert all(state.comments[cid] == comment for cid, comment in before.items()), "look-alikes untouched"
    assert not any(call.startswith("PATCH") and str(cid) in call for call in state.calls for cid in before)
    # A GitHub App's bot, named with --author, finds its own comment and not github-actions'.
    plan.write_text(f"{head}\nby the app\n")
    app = _cli("pr-comment", "--file", str(plan), "--pr", "7", "--author", "other-app[bot]", **env(api))
    assert app.returncode == 0 and "updated comment 1001" in app.stdout
    assert state.comments[1001]["body"] == f"{head}\nby the app\n" and ours["body"].endswith("second push\n")
    assert ours["user"] == BOT


def test_pr_comment_refuses_what_it_cannot_post(tmp_path: Path, github: tuple[State, str]) -> None:
    """No token, no marker line, no such file: one line each, exit 1, nothing posted."""
    state, api = github
    plan = tmp_path / "plan.md"
    plan.write_text("no marker here\n")
    cases = [
        ({"GITHUB_REPOSITORY": "acme/models"}, ["--file", str(plan), "--pr", "7"], "GITHUB_TOKEN not set"),
        (env(api), ["--file", str(plan), "--pr", "7"], "does not start with the plan's hidden marker line"),
        (env(api), ["--file", str(tmp_path / "nope.md"), "--pr", "7"], "--file: got"),
    ]
    for environment, args, expected in cases:
        result = _cli("pr-comment", *args, **environment)
        assert result.returncode == 1 and expected in result.stdout + result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert state.calls == [] and state.comments == {}
