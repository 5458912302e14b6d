"""``pr-comment``: post the markdown plan as ONE pull-request comment, updated on every push.

Why: a CI that posts a new comment per push buries the review under stale plans. The plan's
markdown starts with a hidden marker naming the stack (``<!-- triton-mme-plan stack=NAME -->``);
this command finds the pull request's comment that its own bot wrote (the author's login is
``--author``, ``github-actions[bot]`` by default, and the author's type is ``Bot``) carrying the
same marker, and edits it, or creates one when there is none. A comment anyone else wrote is never
edited, even if it starts with the marker: anyone who can comment can paste it. One comment per
stack, so a pipeline with several stacks or stages keeps one each.

It talks to the GitHub REST API (``GET /repos/{repo}/issues/{pr}/comments``, ``PATCH
/repos/{repo}/issues/comments/{id}``, ``POST /repos/{repo}/issues/{pr}/comments``) with the
token GitHub Actions gives a job (``GITHUB_TOKEN``, with ``pull-requests: write``), at
``GITHUB_API_URL`` (set by Actions; GitHub Enterprise gives its own) for ``GITHUB_REPOSITORY``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.tools.review.github_api import GitHub
from triton_mme_cdk.model_build.tools.review.plan_report import GITHUB_COMMENT_LIMIT

#: The login of the comments GitHub Actions' ``GITHUB_TOKEN`` writes.
ACTIONS_BOT = "github-actions[bot]"


def is_own(comment: dict[str, Any], author: str, marker: str) -> bool:
    """Whether ``comment`` is the one to update: written by ``author``, a bot, and starting with ``marker``."""
    user = comment.get("user") or {}
    return (user.get("login") == author and user.get("type") == "Bot"
            and str(comment.get("body") or "").split("\n", 1)[0].strip() == marker)


def upsert_comment(github: GitHub, pr: int, body: str, *, author: str = ACTIONS_BOT) -> tuple[str, int]:
    """Edit the comment of ``pr`` that ``author`` wrote with ``body``'s first line (its marker),
    or create one. Returns ("updated" | "created", the comment's id)."""
    marker = body.split("\n", 1)[0].strip()
    if not (marker.startswith("<!--") and marker.endswith("-->")):
        raise ModelBuildError("pr-comment: the file does not start with the plan's hidden marker line "
                              "(<!-- triton-mme-plan stack=... -->); give the markdown of `plan --markdown-file`")
    if len(body) > GITHUB_COMMENT_LIMIT:
        raise ModelBuildError(f"pr-comment: {len(body)} characters; GitHub takes at most {GITHUB_COMMENT_LIMIT}")
    for comment in github.pages(f"/issues/{pr}/comments"):
        if is_own(comment, author, marker):
            github.request("PATCH", f"/issues/comments/{comment['id']}", {"body": body})
            return "updated", int(comment["id"])
    created = github.request("POST", f"/issues/{pr}/comments", {"body": body})
    return "created", int(created["id"])


def _pr_number(given: int | None) -> int:
    if given is not None:
        return given
    event_path = os.environ.get("GITHUB_EVENT_PATH")
    if event_path and Path(event_path).is_file():
        number = (json.loads(Path(event_path).read_text(encoding="utf-8")).get("pull_request") or {}).get("number")
        if isinstance(number, int):
            return number
    raise ModelBuildError("pr-comment: no pull request number; give --pr N (or run on a pull_request event)")


def cmd_pr_comment(args: argparse.Namespace) -> int:
    github = GitHub.from_environment("pr-comment", "`pull-requests: write`")
    path = Path(args.file)
    if not path.is_file():
        raise ModelBuildError(f"--file: got {args.file!r}; no such file")
    action, comment_id = upsert_comment(github, _pr_number(args.pr), path.read_text(encoding="utf-8"),
                                        author=args.author)
    print(f"pr-comment: {action} comment {comment_id}")
    return 0


def add_pr_comment_parser(sub: Any) -> None:
    parser = sub.add_parser("pr-comment", help="post the markdown plan as one pull-request comment, updated on "
                                               "every push (GitHub)",
                            description=__doc__.split("\n\n")[1].replace("\n", " "))
    parser.add_argument("--file", required=True, help="the markdown plan (plan --markdown-file)")
    parser.add_argument("--pr", type=int, default=None, help="pull request number (default: the event's)")
    parser.add_argument("--author", default=ACTIONS_BOT,
                        help=f"the login of the bot whose comment is updated (default: {ACTIONS_BOT}, the login of "
                             "GITHUB_TOKEN's comments; a GitHub App's is '<app-slug>[bot]')")
    parser.set_defaults(func=cmd_pr_comment)
