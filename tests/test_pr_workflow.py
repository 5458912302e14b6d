"""The pull-request workflows (.github/workflows/triton-mme-synth.yml and triton-mme-plan.yml) run as written.

Their own ``run:`` scripts, read from the workflow files (not copied here), run with what GitHub
Actions would give them: the synth step on a clone standing for the pull request (the real
``cdk synth``), its files zipped as the artifact upload-artifact keeps; the gate's steps on another
clone standing for the default branch (fetch, plan against a routes file and a deployed template,
gate, comment), against a GitHub REST API on loopback (``tests/github_fake.py``). Across three
pushes: a plan that needs a person stops the check; an approval of its digest by a writer passes it
and the author's own approval is refused; a push that leaves the plan the same keeps the approval;
a push that changes the plan voids it, naming both digests. The steps that are actions (checkout,
setup-python, credentials, artifact upload) are GitHub's and are not run here; what they are given
(pinned by commit, no persisted credentials, no checkout of the pull request in the gate) is read
from the files.
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cdk_helpers import subprocess_env, synth
from github_fake import APP, APP_TOKEN, TOKEN, State, serve, user
from test_plan import _routes

from triton_mme_cdk.model_build.release import model_code_sha256
from triton_mme_cdk.model_build.release.deployed import record_from_template
from triton_mme_cdk.model_build.tools.review.plan_report import marker

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
PLAN, SYNTH = WORKFLOWS / "triton-mme-plan.yml", WORKFLOWS / "triton-mme-synth.yml"
PINNED = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+@[0-9a-f]{40}")


def _workflow(path: Path) -> dict[str, Any]:
    loaded: dict[Any, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    workflow: dict[str, Any] = {("on" if key is True else key): value for key, value in loaded.items()}
    # (YAML 1.1 reads the key `on` as true)
    return workflow


def _job(path: Path) -> dict[str, Any]:
    (job,) = _workflow(path)["jobs"].values()
    return dict(job)


def _run(path: Path, name: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """One ``run:`` step as Actions runs it (``bash -e {0}``), with the job's and the step's env
    replaced by ``env`` (their ``${{ }}`` expressions are what GitHub fills in)."""
    step = next(step for step in _job(path)["steps"] if step.get("name") == name)
    script = step["run"]
    assert "${{" not in script, f"step {name!r}: expressions belong in its env, not in the script"
    return subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=subprocess_env(**env), capture_output=True,
                          text=True, timeout=300)


def test_the_docs_show_the_workflows_as_they_are() -> None:
    docs = (ROOT / "docs" / "pipelines.md").read_text(encoding="utf-8")
    for path in (SYNTH, PLAN):
        assert "```yaml\n" + path.read_text(encoding="utf-8") + "```" in docs, path.name


def test_the_gate_never_runs_the_pull_requests_code() -> None:
    synth_flow, plan_flow = _workflow(SYNTH), _workflow(PLAN)
    # The pull request's code runs only on pull_request, with a read-only token and no AWS access.
    assert set(synth_flow["on"]) == {"pull_request"} and synth_flow["permissions"] == {"contents": "read"}
    synth_job = _job(SYNTH)
    assert not [s for s in synth_job["steps"] if "configure-aws-credentials" in s.get("uses", "")]
    # The gate starts on workflow_run (after that synth) and on comments: GitHub runs both from the
    # default branch's copy of the file. Never on pull_request or pull_request_target.
    assert set(plan_flow["on"]) == {"workflow_run", "issue_comment"}
    assert plan_flow["on"]["workflow_run"]["workflows"] == [synth_flow["name"]]
    job = _job(PLAN)
    assert "github.event.workflow_run.event == 'pull_request'" in job["if"]
    assert "github.event.workflow_run.conclusion == 'success'" in job["if"]
    steps = job["steps"]
    uses = [step["uses"] for flow in (SYNTH, PLAN) for step in _job(flow)["steps"] if "uses" in step]
    assert uses and all(PINNED.fullmatch(use) for use in uses), uses  # every action pinned by commit SHA
    for flow in (SYNTH, PLAN):
        for step in _job(flow)["steps"]:
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False
    # The gate's checkout is the default branch's: no ref, no other repository.
    (checkout,) = [step for step in steps if step.get("uses", "").startswith("actions/checkout@")]
    assert set(checkout["with"]) == {"persist-credentials"}
    # What it installs comes first; then the artifact (as data); then the role.
    names = [step.get("name") or step["uses"].split("@")[0] for step in steps]
    assert (names.index("Install") < names.index("Fetch the template")
            < names.index("aws-actions/configure-aws-credentials") < names.index("Plan")
            < names.index("actions/create-github-app-token") < names.index("Gate") < names.index("Comment"))
    # The artifact's files are only ever arguments of plan (JSON and YAML read as data).
    scripts = "\n".join(step.get("run", "") for step in steps)
    uses_of_pr = re.findall(r"(--[a-z-]+)\s+\"?\$RUNNER_TEMP/pr([\w./-]*)", scripts)
    assert sorted(uses_of_pr) == [("--manifest", "/manifest.yaml"), ("--out", ""), ("--template", "/template.json")]
    assert scripts.count("RUNNER_TEMP") == 3


def test_the_check_is_set_by_the_gates_own_app_only() -> None:
    """Any branch's workflow can post a status as github-actions[bot] with its GITHUB_TOKEN: the
    gate's job has no `statuses: write` for it; the Gate step posts with a token of the gate's own
    GitHub App (its key an environment secret), minted right before it, and names that app's bot
    as the only identity that may set the check."""
    flow = _workflow(PLAN)
    assert "statuses" not in flow["permissions"], flow["permissions"]
    job = _job(PLAN)
    assert job["environment"] == "triton-mme-plan"
    steps = job["steps"]
    (app,) = [s for s in steps if s.get("uses", "").startswith("actions/create-github-app-token@")]
    gate = next(s for s in steps if s.get("name") == "Gate")
    assert steps.index(app) + 1 == steps.index(gate) and app["if"] == gate["if"]
    assert app["with"] == {"client-id": "${{ vars.TRITON_MME_GATE_APP_CLIENT_ID }}",
                           "private-key": "${{ secrets.TRITON_MME_GATE_APP_KEY }}", "permission-statuses": "write",
                           "permission-checks": "read", "permission-pull-requests": "read",
                           "permission-issues": "read"}
    assert gate["env"]["GITHUB_TOKEN"] == f"${{{{ steps.{app['id']}.outputs.token }}}}"
    assert gate["env"]["GATE_IDENTITY"] == f"${{{{ steps.{app['id']}.outputs.app-slug }}}}[bot]"
    assert '--identity "$GATE_IDENTITY"' in gate["run"]
    others = [s for s in steps if s is not gate and "pr-gate" in s.get("run", "")]
    assert not others, "only the Gate step sets the check"


def _owned(pattern: str, path: str) -> bool:
    """Whether a CODEOWNERS pattern of this file's forms (``/dir/``, ``/file``, ``/glob*``) covers ``path``."""
    anchored = pattern.lstrip("/")
    if anchored.endswith("/"):
        return path.startswith(anchored)
    return fnmatch.fnmatchcase(path, anchored)


def test_code_owners_own_the_workflows_the_gate_the_bootstrap_and_the_pipeline() -> None:
    """Every file of the gate's code (what the pipeline packs and runs: gate_files), the workflows,
    bootstrap/ and the pipeline's stacks has an owner in .github/CODEOWNERS, and every rule names one."""
    from triton_mme_cdk.stacks.pipeline_gate_code import gate_files

    rules = [line.split() for line in (ROOT / ".github" / "CODEOWNERS").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert rules and all(len(rule) >= 2 and rule[0].startswith("/") and all(o.startswith("@") for o in rule[1:])
                         for rule in rules), rules
    paths = {str(p.relative_to(ROOT)) for p in gate_files(ROOT) if p.suffix != ".md"}
    paths |= {str(p.relative_to(ROOT)) for folder in (".github", "bootstrap") for p in (ROOT / folder).rglob("*")
              if p.is_file()}
    paths |= {f"stacks/{name}" for name in ("pipeline_stack.py", "pipeline_hold.py", "pipeline_hold_check.py",
                                            "pipeline_gate_code.py", "pipeline_access.py")}
    assert {"model_build/tools/review/pr_gate.py", ".github/workflows/triton-mme-plan.yml", "Makefile"} <= paths
    unowned = sorted(p for p in paths if not any(_owned(rule[0], p) for rule in rules))
    assert not unowned, unowned


def _outputs(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


@pytest.mark.slow
def test_an_approval_holds_for_its_plan_only(tmp_path: Path) -> None:
    # The live state: the routes and deployed template of the base branch's stack.
    deployed = synth(tmp_path / "synth", nag=False).data
    (tmp_path / "deployed.json").write_text(json.dumps(deployed))
    base, pull = tmp_path / "base", tmp_path / "pull"
    for clone in (base, pull):
        subprocess.run(["git", "clone", "--quiet", "--shared", str(ROOT), str(clone)], check=True)
        for name in (".venv", "node_modules"):  # what `make plan-setup` installs there
            (clone / name).symlink_to(ROOT / name)
    routes = tmp_path / "routes.json"
    routes.write_bytes(_routes(deployed=record_from_template(deployed),
                               code_sha256=model_code_sha256(base / "model_build")).body())
    live = f"--routes-file {routes} --deployed-template {tmp_path / 'deployed.json'}"
    state = State()
    state.permissions.update({"alice": {"permission": "write", "role_name": "write"},
                              "bob": {"permission": "write", "role_name": "write"}})

    def push(run_id: int, sha: str, settings: dict[str, str], readme: str = "") -> None:
        """A push to pull request 7: its cdk.json settings, the synth step, the artifact kept."""
        cdk_json = json.loads((pull / "cdk.json").read_text())
        cdk_json["context"].update(settings)
        (pull / "cdk.json").write_text(json.dumps(cdk_json, indent=2))
        if readme:
            (pull / "README.md").write_text(readme)
        done = _run(SYNTH, "Synth", pull, STACK="TritonMme", PR_NUMBER="7")
        assert done.returncode == 0, done.stdout + done.stderr
        files = {p.name: p.read_bytes() for p in (pull / "pr-template").iterdir()}
        assert sorted(files) == ["manifest.yaml", "pr.json", "template.json"]
        state.run(run_id, sha, files)
        state.pull(7, "bob", sha)

    def gate(api: str, **event: str) -> tuple[str, subprocess.CompletedProcess[str]]:
        """The gate job's steps in order, as their `if:`s run them: (the plan's exit code, the gate step)."""
        runner = tmp_path / "runner"
        github = {"GITHUB_TOKEN": TOKEN, "GITHUB_REPOSITORY": "acme/models", "GITHUB_API_URL": api,
                  "RUNNER_TEMP": str(runner)}
        for name in ("plan.md", "plan.json"):
            (base / name).unlink(missing_ok=True)
        outputs = tmp_path / "fetch_output"
        outputs.write_text("")
        fetched = _run(PLAN, "Fetch the template", base, GITHUB_OUTPUT=str(outputs), **github, **event)
        assert fetched.returncode == 0, fetched.stdout + fetched.stderr
        fetch = _outputs(outputs)
        plan_output = tmp_path / "plan_output"
        plan_output.write_text("")
        planned = _run(PLAN, "Plan", base, PLAN_LIVE=live, HAS_MANIFEST=fetch["manifest"],
                       GITHUB_OUTPUT=str(plan_output), **github)
        assert planned.returncode == 0, planned.stdout + planned.stderr
        code = _outputs(plan_output)["exit_code"]
        gated = _run(PLAN, "Gate", base, PR_NUMBER=fetch["pr"], HEAD_SHA=fetch["head_sha"],
                     **{**github, **app})
        commented = _run(PLAN, "Comment", base, PR_NUMBER=fetch["pr"], **github)
        assert commented.returncode == 0, commented.stdout + commented.stderr
        return code, gated

    sha1, sha2, sha3 = "1" * 40, "2" * 40, "3" * 40
    app = {"GITHUB_TOKEN": APP_TOKEN, "GATE_IDENTITY": APP["login"]}  # what the app-token step gives the Gate step
    with serve(state) as api:
        # Push 1: a bigger instance type. The plan replaces the fleet: the check stops.
        push(101, sha1, {"mme:instance_type": "ml.g5.2xlarge"})
        code, gated = gate(api, RUN_ID="101", PR_NUMBER="")
        assert code == "4" and gated.returncode == 1, gated.stdout + gated.stderr
        digest1 = json.loads((base / "plan.json").read_text())["digest"]
        (comment,) = state.ours(7)
        assert comment["body"].startswith(marker("TritonMme"))
        assert "fleet replaced because EndpointConfig ProductionVariants[0].InstanceType" in comment["body"]
        assert f"Plan digest: `{digest1}`" in comment["body"] and f"`/approve-plan {digest1}`" in comment["body"]
        assert state.statuses[-1][0] == sha1 and state.statuses[-1][1]["state"] == "failure"
        # The author approves their own plan: refused. A writer approves it: the comment's run passes.
        state.comment(7, f"/approve-plan {digest1}", user("bob"))
        alices = state.comment(7, f"/approve-plan {digest1}", user("alice"))
        code, gated = gate(api, RUN_ID="", PR_NUMBER="7")
        assert code == "4" and gated.returncode == 0, gated.stdout + gated.stderr
        assert "@bob is the pull request's author, who cannot approve its plan" in gated.stdout
        assert f"approved by @alice for {digest1}" in gated.stdout
        sha, status = state.statuses[-1]
        assert (sha, status["state"], status["context"], status["description"]) == (
            sha1, "success", "triton-mme/plan-approval", "approved by @alice")
        # Push 2: a README edit. The same plan, the same digest: alice's approval holds.
        push(102, sha2, {}, readme="# a documentation change\n")
        code, gated = gate(api, RUN_ID="102", PR_NUMBER="")
        assert code == "4" and gated.returncode == 0, gated.stdout + gated.stderr
        assert json.loads((base / "plan.json").read_text())["digest"] == digest1
        assert state.statuses[-1][0] == sha2 and state.statuses[-1][1]["state"] == "success"
        # Push 3: another instance type. Another plan: alice's approval is void, and the gate names both digests.
        push(103, sha3, {"mme:instance_type": "ml.g5.4xlarge"})
        code, gated = gate(api, RUN_ID="103", PR_NUMBER="")
        digest3 = json.loads((base / "plan.json").read_text())["digest"]
        assert code == "4" and gated.returncode == 1 and digest3 != digest1
        assert (f"approval by @alice (comment {alices}) refused: it names plan {digest1}; this plan is {digest3} "
                "(a push changed the plan)") in gated.stdout
        assert state.statuses[-1][0] == sha3 and state.statuses[-1][1]["state"] == "failure"
        (comment,) = state.ours(7)  # one plan comment, updated by every run
        assert f"Plan digest: `{digest3}`" in comment["body"] and "**Gate:** ⛔" in comment["body"]
        assert "ml.g5.4xlarge" in comment["body"]
        # A plan that fails (a broken routes file) fails its step with the error line; the gate sets a failure.
        routes.write_bytes(routes.read_bytes()[:50])
        github = {"GITHUB_TOKEN": TOKEN, "GITHUB_REPOSITORY": "acme/models", "GITHUB_API_URL": api,
                  "RUNNER_TEMP": str(tmp_path / "runner")}
        (base / "plan.json").unlink()
        (base / "plan.md").unlink()
        output = tmp_path / "plan_output"
        output.write_text("")
        failed = _run(PLAN, "Plan", base, PLAN_LIVE=live, HAS_MANIFEST="true", GITHUB_OUTPUT=str(output), **github)
        assert failed.returncode == 1 and "truncated" in failed.stderr and output.read_text() == "exit_code=1\n"
        gated = _run(PLAN, "Gate", base, PR_NUMBER="7", HEAD_SHA=sha3, **{**github, **app})
        assert gated.returncode == 1 and "the plan step failed" in gated.stderr
        assert state.statuses[-1][1]["description"] == "the plan did not run: see the run's log"
