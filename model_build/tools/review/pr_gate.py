"""``pr-gate``: pass or stop a pull request on its plan; a plan that needs a person passes only
with an approval bound to its digest.

Why: the label this replaced outlived the plan it approved, and anyone with triage rights, the
author included, could add it. An approval here is a comment on the pull request whose line is
``/approve-plan sha256:<digest>``, the digest of the plan it approves (``plan.json``'s
``digest``, shown in the plan comment). It counts only when GitHub's API says:

- its author is a person (``type`` ``User``), not the pull request's author;
- the author may write to the repository (``GET /collaborators/{login}/permission``:
  ``admin`` or ``write``; ``maintain`` is ``write`` there, ``triage`` is ``read``);
- the comment was not edited (``updated_at`` equals ``created_at``: someone with write access can
  edit anyone's comment, so an edited approval is not its author's word);
- its digest is this plan's. A push that changes the plan changes the digest, and the old approval
  stops counting (the gate names both digests); a push that leaves the plan the same keeps it.

Plans that exit 0 or 3 pass without anyone. The verdict is a commit status on the pull request's
head (``POST /statuses/{sha}``, context ``--context``, default :data:`CONTEXT`): the check branch
protection requires. ``--markdown-file`` gets the gate's section appended (the plan comment then
says who approved, or how to approve and why each approval found was refused). Exit 0 passed, 1
stopped.

The status is the gate's only where the gate alone can set it. Every workflow of every branch
posts as ``github-actions[bot]`` with its ``GITHUB_TOKEN``, so the gate posts with its own GitHub
App's token (``--identity``: that app's bot login) and refuses to run as ``github-actions[bot]``;
the repository's required check names that app as its source (docs/pipelines.md). Where the gate
can see the check set by anyone else (a status of its context whose ``creator`` is not
``--identity``, or a check run of that name: the gate sets none), it stops the pull request and
names each one. It checks too that GitHub recorded its own status as ``--identity``'s. The token
needs ``statuses: write``, ``checks: read``, ``pull-requests: read`` and ``issues: read``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.tools.review.github_api import GitHub, GitHubError
from triton_mme_cdk.model_build.tools.review.plan_report import DIGEST_PATTERN, EXIT_NEEDS_REVIEW, plan_digest

CONTEXT = "triton-mme/plan-approval"
COMMAND = "/approve-plan"
APPROVAL_LINE = re.compile(rf"{re.escape(COMMAND)}\s+({DIGEST_PATTERN})")
WRITERS = ("admin", "write")
#: The identity of every workflow's ``GITHUB_TOKEN``: never the gate's.
ACTIONS_BOT = "github-actions[bot]"
#: GitHub's limit on a status's description.
DESCRIPTION_LIMIT = 140


@dataclass
class Decision:
    passed: bool
    line: str
    approved_by: str = ""
    refusals: list[str] = field(default_factory=list)


def read_plan(path: Path) -> dict[str, Any]:
    """The plan JSON the gate's own ``plan`` wrote, its digest checked."""
    if not path.is_file():
        raise ModelBuildError(f"--plan: got {str(path)!r}; no such file (the plan step failed: see its error line)")
    try:
        plan: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        digest = plan_digest(plan)
    except (ValueError, KeyError, TypeError) as error:
        raise ModelBuildError(f"--plan {path}: not a plan's JSON ({error})") from None
    if plan.get("digest") != digest:
        raise ModelBuildError(f"--plan {path}: digest {plan.get('digest')!r} is not its content's ({digest})")
    return plan


def approvals(comment: dict[str, Any]) -> list[str]:
    """The digests ``comment`` approves: each line that is ``/approve-plan sha256:<hex>``."""
    return [match.group(1) for line in str(comment.get("body") or "").splitlines()
            if (match := APPROVAL_LINE.fullmatch(line.strip()))]


def decide(github: GitHub, pr: int, plan: dict[str, Any]) -> Decision:
    """Whether the plan passes: by its exit code, or by an approval of its digest."""
    digest, code = plan["digest"], plan["exit_code"]
    if code != EXIT_NEEDS_REVIEW:
        return Decision(True, f"plan exit {code} ({plan['verdict']}): nothing that needs a person")
    author = ((github.get(f"/pulls/{pr}").get("user")) or {}).get("login")
    if not isinstance(author, str) or not author:
        raise ModelBuildError(f"pr-gate: GET /pulls/{pr} names no author; no approval can be checked")
    refusals: list[str] = []
    permissions: dict[str, tuple[str, str]] = {}
    for comment in github.pages(f"/issues/{pr}/comments"):
        for given in approvals(comment):
            user = comment.get("user") or {}
            login = str(user.get("login") or "?")
            who = f"approval by @{login} (comment {comment.get('id')})"
            if user.get("type") != "User":
                refusals.append(f"{who} refused: a {user.get('type') or 'non-person'} account, not a person")
            elif login == author:
                refusals.append(f"{who} refused: @{login} is the pull request's author, who cannot approve its plan")
            elif comment.get("updated_at") != comment.get("created_at"):
                refusals.append(f"{who} refused: the comment was edited after it was posted (anyone with write "
                                "access can edit a comment); post a new one")
            elif given != digest:
                refusals.append(f"{who} refused: it names plan {given}; this plan is {digest} (a push changed the "
                                "plan); approve this digest")
            else:
                if login not in permissions:
                    answer = _permission(github, login)
                    permissions[login] = (str(answer.get("permission") or "none"),
                                          str(answer.get("role_name") or answer.get("permission") or "none"))
                permission, role = permissions[login]
                if permission in WRITERS:
                    return Decision(True, f"plan exit 4 ({plan['verdict']}), approved by @{login} for {digest}",
                                    approved_by=login, refusals=refusals)
                refusals.append(f"{who} refused: @{login}'s permission on the repository is {role!r}; write, "
                                "maintain or admin is needed")
    return Decision(False, f"plan exit 4 ({plan['verdict']}) needs a person: someone with write access, not the pull "
                           f"request's author, comments `{COMMAND} {digest}`", refusals=refusals)


def _permission(github: GitHub, login: str) -> dict[str, Any]:
    try:
        answer: dict[str, Any] = github.get(f"/collaborators/{login}/permission")
    except GitHubError as error:
        if error.status == 404:
            return {"permission": "none", "role_name": "none (not a collaborator)"}
        raise
    return answer


def foreign_checks(github: GitHub, sha: str, context: str, identity: str) -> list[str]:
    """Every status of ``context`` on ``sha`` that ``identity`` did not set, and every check run
    of that name (the gate sets statuses only), one line each."""
    found = []
    for status in github.pages(f"/commits/{sha}/statuses"):
        creator = (status.get("creator") or {}).get("login")
        if status.get("context") == context and creator != identity:
            found.append(f"status {context} = {status.get('state')} (id {status.get('id')}) set by @{creator}, not by "
                         f"the gate's app @{identity}: refused")
    for run in github.pages(f"/commits/{sha}/check-runs?check_name={urllib.parse.quote(context)}", "check_runs"):
        if run.get("name") == context:
            app = (run.get("app") or {}).get("slug")
            found.append(f"check run {context} = {run.get('conclusion') or run.get('status')} (id {run.get('id')}) "
                         f"set by the app {app!r}; the gate sets statuses only: refused")
    return found


def post_status(github: GitHub, sha: str, decision: Decision, context: str, identity: str) -> None:
    run = os.environ.get("GITHUB_RUN_ID")
    server = os.environ.get("GITHUB_SERVER_URL", "https://github.com")
    body = {"state": "success" if decision.passed else "failure", "context": context,
            "description": _short(decision)}
    if run:
        body["target_url"] = f"{server}/{github.repository}/actions/runs/{run}"
    answer = github.request("POST", f"/statuses/{sha}", body)
    creator = ((answer if isinstance(answer, dict) else {}).get("creator") or {}).get("login")
    if creator != identity:
        raise ModelBuildError(f"pr-gate: GitHub recorded the status as set by @{creator}, not by --identity "
                              f"@{identity}: the gate's token is not its app's (docs/pipelines.md)")


def _short(decision: Decision) -> str:
    if decision.approved_by:
        text = f"approved by @{decision.approved_by}"
    elif decision.passed or decision.line.startswith(("the plan did not run", "the check ")):
        text = decision.line
    else:
        text = "needs an approval of this plan's digest: see the plan comment"
    return text if len(text) <= DESCRIPTION_LIMIT else text[:DESCRIPTION_LIMIT - 1] + "…"


def markdown_section(decision: Decision) -> str:
    mark = "✅" if decision.passed else "⛔"
    lines = ["", f"**Gate:** {mark} {decision.line}"]
    if decision.refusals:
        lines += ["", *[f"- {refusal}" for refusal in decision.refusals[:20]]]
        if len(decision.refusals) > 20:
            lines.append(f"- … and {len(decision.refusals) - 20} more (the run's log lists every one)")
    if not decision.passed:
        lines += ["", "A push that changes the plan changes its digest: an approval of the old one no longer counts."]
    return "\n".join(lines) + "\n"


def cmd_pr_gate(args: argparse.Namespace) -> int:
    if not re.fullmatch(r"[0-9a-f]{40}", args.head_sha or ""):
        raise ModelBuildError(f"--head-sha: got {args.head_sha!r}; expected a commit SHA (40 hex digits)")
    identity = str(args.identity or "")
    if not identity or identity == ACTIONS_BOT:
        raise ModelBuildError(f"--identity: got {identity!r}; expected the bot login of the gate's own GitHub App "
                              f"(<app-slug>[bot]): every workflow of every branch posts as {ACTIONS_BOT}, so a status "
                              "it sets is nobody's in particular (docs/pipelines.md)")
    github = GitHub.from_environment("pr-gate", "its app's token with `statuses: write`, `checks: read`, "
                                                "`pull-requests: read` and `issues: read`")
    try:
        plan = read_plan(Path(args.plan))
    except ModelBuildError:
        post_status(github, args.head_sha, Decision(False, "the plan did not run: see the run's log"), args.context,
                    identity)
        raise
    decision = decide(github, args.pr, plan)
    foreign = foreign_checks(github, args.head_sha, args.context, identity)
    if foreign:
        decision = Decision(False, f"the check {args.context} was also set by another identity; only the plan "
                                   f"workflow's app @{identity} may set it", refusals=[*foreign, *decision.refusals])
    if args.markdown_file:
        path = Path(args.markdown_file)
        path.write_text(path.read_text(encoding="utf-8") + markdown_section(decision), encoding="utf-8")
    post_status(github, args.head_sha, decision, args.context, identity)
    for refusal in decision.refusals:
        print(f"pr-gate: {refusal}")
    print(f"pr-gate: {'passed' if decision.passed else 'stopped'}: {decision.line}")
    return 0 if decision.passed else 1


def add_pr_gate_parser(sub: Any) -> None:
    parser = sub.add_parser("pr-gate", help="pass or stop a pull request on its plan: exit 4 needs an approval of the "
                                            "plan's digest (GitHub)",
                            description=__doc__.split("\n\n")[1].replace("\n", " "))
    parser.set_defaults(func=cmd_pr_gate)
    parser.add_argument("--plan", required=True, help="the plan's JSON (plan --json-file)")
    parser.add_argument("--pr", type=int, required=True, help="the pull request's number")
    parser.add_argument("--head-sha", required=True, help="the pull request's head commit (the status goes there)")
    parser.add_argument("--markdown-file", default=None, help="append the gate's section to this markdown plan")
    parser.add_argument("--identity", required=True, metavar="LOGIN",
                        help="the bot login of the gate's own GitHub App (<app-slug>[bot]), whose token GITHUB_TOKEN "
                             "is: the only identity that may set the check")
    parser.add_argument("--context", default=CONTEXT, help=f"the commit status's context (default: {CONTEXT})")
