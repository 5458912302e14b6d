"""``pr-comment``: post the markdown plan as ONE pull-request comment, updated on every push.

Why: a CI that posts a new comment per push buries the review under stale plans. The plan's
markdown starts with a hidden marker naming the stack (``<!-- triton-mme-plan stack=NAME -->``);
this command finds the pull request's comment that carries the same marker and edits it, or
creates it when there is none. One comment per stack, so a pipeline with several stacks or stages
keeps one each.

It talks to the GitHub REST API (``GET /repos/{repo}/issues/{pr}/comments``, ``PATCH
/repos/{repo}/issues/comments/{id}``, ``POST /repos/{repo}/issues/{pr}/comments``) with the
token GitHub Actions gives a job (``GITHUB_TOKEN``, with ``pull-requests: write``), at
``GITHUB_API_URL`` (set by Actions; GitHub Enterprise gives its own) for ``GITHUB_REPOSITORY``.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.tools.plan_report import GITHUB_COMMENT_LIMIT

PAGE = 100


def _request(method: str, url: str, token: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json",
        "X-GitHub-Api-Version": "2022-11-28", "Content-Type": "application/json",
    })
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        detail = error.read()[:300].decode(errors="replace")
        raise ModelBuildError(f"pr-comment: {method} {url} answered {error.code} ({' '.join(detail.split())})") from None
    except urllib.error.URLError as error:
        raise ModelBuildError(f"pr-comment: {method} {url} failed ({error.reason})") from None


def upsert_comment(api_url: str, repository: str, pr: int, token: str, body: str) -> tuple[str, int]:
    """Edit the comment of ``pr`` that carries ``body``'s first line (its marker), or create one.
    Returns ("updated" | "created", the comment's id)."""
    marker = body.split("\n", 1)[0].strip()
    if not (marker.startswith("<!--") and marker.endswith("-->")):
        raise ModelBuildError("pr-comment: the file does not start with the plan's hidden marker line "
                              "(<!-- triton-mme-plan stack=... -->); give the markdown of `plan --markdown-file`")
    if len(body) > GITHUB_COMMENT_LIMIT:
        raise ModelBuildError(f"pr-comment: {len(body)} characters; GitHub takes at most {GITHUB_COMMENT_LIMIT}")
    base = f"{api_url.rstrip('/')}/repos/{repository}"
    page = 1
    while True:
        comments = _request("GET", f"{base}/issues/{pr}/comments?per_page={PAGE}&page={page}", token)
        for comment in comments:
            if str(comment.get("body") or "").split("\n", 1)[0].strip() == marker:
                _request("PATCH", f"{base}/issues/comments/{comment['id']}", token, {"body": body})
                return "updated", int(comment["id"])
        if len(comments) < PAGE:
            break
        page += 1
    created = _request("POST", f"{base}/issues/{pr}/comments", token, {"body": body})
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
    token = os.environ.get("GITHUB_TOKEN", "")
    repository = os.environ.get("GITHUB_REPOSITORY", "")
    if not token or not repository:
        missing = " and ".join(name for name, value in (("GITHUB_TOKEN", token), ("GITHUB_REPOSITORY", repository))
                               if not value)
        raise ModelBuildError(f"pr-comment: {missing} not set (GitHub Actions sets them; give the job "
                              "`pull-requests: write`)")
    path = Path(args.file)
    if not path.is_file():
        raise ModelBuildError(f"--file: got {args.file!r}; no such file")
    api_url = os.environ.get("GITHUB_API_URL", "https://api.github.com")
    action, comment_id = upsert_comment(api_url, repository, _pr_number(args.pr), token,
                                        path.read_text(encoding="utf-8"))
    print(f"pr-comment: {action} comment {comment_id}")
    return 0


def add_pr_comment_parser(sub: Any) -> None:
    parser = sub.add_parser("pr-comment", help="post the markdown plan as one pull-request comment, updated on "
                                               "every push (GitHub)",
                            description=__doc__.split("\n\n")[1].replace("\n", " "))
    parser.add_argument("--file", required=True, help="the markdown plan (plan --markdown-file)")
    parser.add_argument("--pr", type=int, default=None, help="pull request number (default: the event's)")
    parser.set_defaults(func=cmd_pr_comment)
