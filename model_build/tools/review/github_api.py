"""A small client of GitHub's REST API, for the pull-request commands (``pr-comment``, ``pr-fetch``,
``pr-gate``).

It talks to ``GITHUB_API_URL`` (set by Actions; GitHub Enterprise gives its own) for
``GITHUB_REPOSITORY`` with the token GitHub Actions gives a job (``GITHUB_TOKEN``). Every error is
one line naming the method, the URL and GitHub's answer. A download (an artifact's zip) follows
GitHub's redirect to its storage *without* the token (the storage URL is signed; the token is for
GitHub alone) and stops reading past a byte limit.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

from triton_mme_cdk.model_build.errors import ModelBuildError

PAGE = 100
TIMEOUT_SECONDS = 30


class GitHubError(ModelBuildError):
    """GitHub answered an HTTP error (``status``)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is returned to the caller, which follows it without the token."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class GitHub:
    """``api_url`` (``https://api.github.com``), ``repository`` (``owner/name``), ``token``;
    ``command`` names the caller in errors."""

    def __init__(self, api_url: str, repository: str, token: str, *, command: str) -> None:
        self.api_url, self.repository, self.token, self.command = api_url.rstrip("/"), repository, token, command
        self.base = f"{self.api_url}/repos/{repository}"

    @classmethod
    def from_environment(cls, command: str, scopes: str) -> GitHub:
        """The client of a GitHub Actions job; one line naming what is missing otherwise
        (``scopes``: the ``permissions:`` the job needs, for that line)."""
        token = os.environ.get("GITHUB_TOKEN", "")
        repository = os.environ.get("GITHUB_REPOSITORY", "")
        if not token or not repository:
            missing = " and ".join(name for name, value in (("GITHUB_TOKEN", token), ("GITHUB_REPOSITORY", repository))
                                   if not value)
            raise ModelBuildError(f"{command}: {missing} not set (GitHub Actions sets them; give the job {scopes})")
        return cls(os.environ.get("GITHUB_API_URL", "https://api.github.com"), repository, token, command=command)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": "2022-11-28", "Content-Type": "application/json"}

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """``path`` under the repository (``/pulls/7``), or an absolute URL of the API."""
        url = path if path.startswith(self.api_url) else f"{self.base}{path}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers=self._headers())
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            detail = error.read()[:300].decode(errors="replace")
            raise GitHubError(f"{self.command}: {method} {url} answered {error.code} "
                              f"({' '.join(detail.split())})", error.code) from None
        except urllib.error.URLError as error:
            raise ModelBuildError(f"{self.command}: {method} {url} failed ({error.reason})") from None
        except ValueError:
            raise ModelBuildError(f"{self.command}: {method} {url} answered something that is not JSON") from None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def pages(self, path: str, key: str | None = None) -> Iterator[Any]:
        """Every item of a paginated list (``?per_page=100&page=N`` until a short page); ``key``
        where the list is a field of the answer (``workflow_runs``, ``artifacts``)."""
        separator = "&" if "?" in path else "?"
        page = 1
        while True:
            answer = self.get(f"{path}{separator}per_page={PAGE}&page={page}")
            items = answer.get(key) if key and isinstance(answer, dict) else answer
            if not isinstance(items, list):
                raise ModelBuildError(f"{self.command}: GET {self.base}{path} answered no list"
                                      + (f" under {key!r}" if key else ""))
            yield from items
            if len(items) < PAGE:
                return
            page += 1

    def download(self, path: str, limit: int) -> bytes:
        """The bytes at ``path`` (at most ``limit``: more is an error), following one redirect
        without the token."""
        url = path if path.startswith(self.api_url) else f"{self.base}{path}"
        opener = urllib.request.build_opener(_NoRedirect)
        request = urllib.request.Request(url, headers=self._headers())
        try:
            try:
                with opener.open(request, timeout=TIMEOUT_SECONDS) as response:
                    return _read_capped(response, limit, url, self.command)
            except urllib.error.HTTPError as error:
                if error.code not in (301, 302, 303, 307, 308) or not error.headers.get("Location"):
                    raise
                location = urllib.parse.urljoin(url, error.headers["Location"])
            if urllib.parse.urlsplit(location).scheme not in ("https", "http"):
                raise ModelBuildError(f"{self.command}: GET {url} redirected to {location!r}, not an HTTP(S) URL")
            with urllib.request.urlopen(urllib.request.Request(location), timeout=TIMEOUT_SECONDS) as response:
                return _read_capped(response, limit, location.split("?")[0], self.command)
        except urllib.error.HTTPError as error:
            raise GitHubError(f"{self.command}: GET {url} answered {error.code}", error.code) from None
        except urllib.error.URLError as error:
            raise ModelBuildError(f"{self.command}: GET {url} failed ({error.reason})") from None


def _read_capped(response: Any, limit: int, url: str, command: str) -> bytes:
    data: bytes = response.read(limit + 1)
    if len(data) > limit:
        raise ModelBuildError(f"{command}: {url} is larger than {limit} bytes; refused")
    return data
