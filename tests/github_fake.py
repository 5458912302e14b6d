"""The part of GitHub's REST API the pull-request commands use, served on loopback and kept in memory.

A real HTTP server (``ThreadingHTTPServer`` on 127.0.0.1), answering as GitHub documents each call:
issue comments (list, create as the token's bot ``github-actions[bot]``, edit), pull requests,
a collaborator's permission (404 for a stranger), workflow runs and their artifacts (an
artifact's zip is a 302 to a "storage" path on the same server, which refuses a request that
carries the token, as a signed storage URL would have no use for it), commit statuses (create;
list a commit's, newest first, each with its ``creator``: the identity of the token that set it)
and a commit's check runs (each with its ``app``). Every API call must carry ``Authorization:
Bearer <token>``: :data:`TOKEN` is a workflow's ``GITHUB_TOKEN`` (``github-actions[bot]``),
:data:`APP_TOKEN` the gate's own GitHub App's (:data:`APP`); each call is logged in :attr:`calls`.
"""

from __future__ import annotations

import io
import json
import re
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

TOKEN = "token-1"
APP_TOKEN = "app-token-1"
REPO = "acme/models"
BOT = {"login": "github-actions[bot]", "type": "Bot"}
APP = {"login": "triton-mme-gate[bot]", "type": "Bot"}
#: Who each token is.
TOKENS = {TOKEN: BOT, APP_TOKEN: APP}


def user(login: str, kind: str = "User") -> dict[str, str]:
    return {"login": login, "type": kind}


def zip_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


@dataclass
class State:
    comments: dict[int, dict[str, Any]] = field(default_factory=dict)
    pulls: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: login -> the permission endpoint's answer ({"permission": ..., "role_name": ...}); others 404.
    permissions: dict[str, dict[str, str]] = field(default_factory=dict)
    runs: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: run id -> artifact zips by name.
    artifacts: dict[int, dict[str, bytes]] = field(default_factory=dict)
    #: (sha, body) of every status created, in order.
    statuses: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    #: Every status as the API lists it (id, sha, its body's fields, creator).
    status_records: list[dict[str, Any]] = field(default_factory=list)
    #: Check runs as the API lists them (id, sha, name, status, conclusion, app).
    check_runs: list[dict[str, Any]] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    clock: int = 0

    def comment(self, pr: int, body: str, author: dict[str, str], *, edited: bool = False) -> int:
        self.clock += 1
        created = f"2026-11-27T01:{self.clock // 60:02d}:{self.clock % 60:02d}Z"
        comment_id = 1000 + len(self.comments)
        self.comments[comment_id] = {"id": comment_id, "pr": pr, "body": body, "user": author,
                                     "created_at": created,
                                     "updated_at": created.replace("T01", "T02") if edited else created}
        return comment_id

    def pull(self, number: int, author: str, head_sha: str, state: str = "open") -> None:
        self.pulls[number] = {"number": number, "state": state, "user": user(author), "head": {"sha": head_sha}}

    def run(self, run_id: int, head_sha: str, files: dict[str, bytes] | None = None, *, event: str = "pull_request",
            conclusion: str = "success", artifact: str = "triton-mme-template", raw: bytes | None = None) -> None:
        self.runs[run_id] = {"id": run_id, "head_sha": head_sha, "event": event, "conclusion": conclusion,
                             "status": "completed", "path": ".github/workflows/triton-mme-synth.yml"}
        self.artifacts[run_id] = {artifact: raw if raw is not None else zip_of(files or {})}

    def status(self, sha: str, body: dict[str, Any], creator: dict[str, str]) -> dict[str, Any]:
        """A status created by ``creator`` (what ``POST /statuses/{sha}`` with its token does)."""
        record = {"id": 5000 + len(self.status_records), "sha": sha, **body, "creator": creator}
        self.statuses.append((sha, body))
        self.status_records.append(record)
        return record

    def check_run(self, sha: str, name: str, app_slug: str, conclusion: str = "success") -> None:
        self.check_runs.append({"id": 7000 + len(self.check_runs), "head_sha": sha, "name": name,
                                "status": "completed", "conclusion": conclusion,
                                "app": {"id": 900 + len(self.check_runs), "slug": app_slug}})

    def ours(self, pr: int) -> list[dict[str, Any]]:
        return [c for c in self.comments.values() if c["pr"] == pr and c["user"] == BOT]


class _Handler(BaseHTTPRequestHandler):
    state: State
    #: The identity of the request's token.
    caller: dict[str, str]

    def _reply(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/zip" if isinstance(body, bytes) else "application/json")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        body: dict[str, Any] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        return body

    def _api(self, method: str) -> tuple[str, dict[str, list[str]]] | None:
        parts = urlsplit(self.path)
        if parts.path.startswith("/storage/"):
            self.state.calls.append(f"STORAGE {method} {parts.path}")
            return parts.path, {}
        self.state.calls.append(f"{method} {self.path}")
        token = str(self.headers.get("Authorization") or "").removeprefix("Bearer ")
        if token not in TOKENS:
            self._reply(401, {"message": "Bad credentials"})
            return None
        self.caller = TOKENS[token]
        prefix = f"/repos/{REPO}"
        if not parts.path.startswith(prefix):
            self._reply(404, {"message": "Not Found"})
            return None
        return parts.path[len(prefix):], parse_qs(parts.query)

    @staticmethod
    def _page(items: list[Any], query: dict[str, list[str]]) -> list[Any]:
        page, size = int(query.get("page", ["1"])[0]), int(query.get("per_page", ["30"])[0])
        return items[(page - 1) * size:page * size]

    def do_GET(self) -> None:
        found = self._api("GET")
        if found is None:
            return
        path, query = found
        state = self.state
        if m := re.fullmatch(r"/storage/(\d+)/(.+)", path):
            if self.headers.get("Authorization"):
                self._reply(400, {"message": "the storage refuses an Authorization header"})
                return
            self._reply(200, state.artifacts[int(m.group(1))][m.group(2)])
        elif m := re.fullmatch(r"/issues/(\d+)/comments", path):
            items = sorted((c for c in state.comments.values() if c["pr"] == int(m.group(1))), key=lambda c: c["id"])
            self._reply(200, self._page([{k: v for k, v in c.items() if k != "pr"} for c in items], query))
        elif m := re.fullmatch(r"/pulls/(\d+)", path):
            pull = state.pulls.get(int(m.group(1)))
            self._reply(*((200, pull) if pull else (404, {"message": "Not Found"})))
        elif m := re.fullmatch(r"/collaborators/([^/]+)/permission", path):
            answer = state.permissions.get(m.group(1))
            if answer is None:
                self._reply(404, {"message": f"{m.group(1)} is not a user"})
            else:
                self._reply(200, {**answer, "user": user(m.group(1))})
        elif m := re.fullmatch(r"/commits/([0-9a-f]{40})/statuses", path):
            records = [r for r in reversed(state.status_records) if r["sha"] == m.group(1)]
            self._reply(200, self._page([{k: v for k, v in r.items() if k != "sha"} for r in records], query))
        elif m := re.fullmatch(r"/commits/([0-9a-f]{40})/check-runs", path):
            runs = [r for r in state.check_runs if r["head_sha"] == m.group(1)
                    and r["name"] == query.get("check_name", [r["name"]])[0]]
            self._reply(200, {"total_count": len(runs), "check_runs": self._page(runs, query)})
        elif m := re.fullmatch(r"/actions/runs/(\d+)", path):
            run = state.runs.get(int(m.group(1)))
            self._reply(*((200, run) if run else (404, {"message": "Not Found"})))
        elif m := re.fullmatch(r"/actions/workflows/([^/]+)/runs", path):
            runs = [r for r in state.runs.values() if r["path"].endswith("/" + m.group(1))
                    and r["head_sha"] == query.get("head_sha", [r["head_sha"]])[0]
                    and r["event"] == query.get("event", [r["event"]])[0]
                    and r["conclusion"] == query.get("status", [r["conclusion"]])[0]]
            self._reply(200, {"total_count": len(runs), "workflow_runs": self._page(runs, query)})
        elif m := re.fullmatch(r"/actions/runs/(\d+)/artifacts", path):
            run_id = int(m.group(1))
            items = [{"id": run_id * 100 + i, "name": name, "size_in_bytes": len(data), "expired": False,
                      "archive_download_url": f"{self._root()}/repos/{REPO}/actions/artifacts/{run_id * 100 + i}/zip"}
                     for i, (name, data) in enumerate(state.artifacts.get(run_id, {}).items())]
            self._reply(200, {"total_count": len(items), "artifacts": self._page(items, query)})
        elif m := re.fullmatch(r"/actions/artifacts/(\d+)/zip", path):
            run_id, index = divmod(int(m.group(1)), 100)
            name = list(state.artifacts[run_id])[index]
            self._reply(302, b"", {"Location": f"{self._root()}/storage/{run_id}/{name}?sig=abc"})
        else:
            self._reply(404, {"message": "Not Found"})

    def _root(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"  # type: ignore[attr-defined]

    def do_POST(self) -> None:
        found = self._api("POST")
        if found is None:
            return
        path, _ = found
        if m := re.fullmatch(r"/issues/(\d+)/comments", path):
            comment_id = self.state.comment(int(m.group(1)), self._body()["body"], self.caller)
            self._reply(201, {k: v for k, v in self.state.comments[comment_id].items() if k != "pr"})
        elif m := re.fullmatch(r"/statuses/([0-9a-f]{40})", path):
            record = self.state.status(m.group(1), self._body(), self.caller)
            self._reply(201, {k: v for k, v in record.items() if k != "sha"})
        else:
            self._reply(404, {"message": "Not Found"})

    def do_PATCH(self) -> None:
        found = self._api("PATCH")
        if found is None:
            return
        path, _ = found
        if m := re.fullmatch(r"/issues/comments/(\d+)", path):
            comment = self.state.comments[int(m.group(1))]
            comment["body"] = self._body()["body"]
            self._reply(200, {k: v for k, v in comment.items() if k != "pr"})
        else:
            self._reply(404, {"message": "Not Found"})

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def serve(state: State) -> Iterator[str]:
    """The API's URL (``http://127.0.0.1:PORT``) while the server runs."""
    handler = type("Handler", (_Handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def env(api: str, **extra: str) -> dict[str, str]:
    """What Actions gives the job's steps, for these commands."""
    return {"GITHUB_TOKEN": TOKEN, "GITHUB_REPOSITORY": REPO, "GITHUB_API_URL": api, **extra}
