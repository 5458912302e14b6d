"""The README and the pages under docs/ link to each other: every relative link leads to a file that
exists, and every ``#anchor`` to a heading of the page it names (GitHub's anchor rules). Source
files that name a page (``docs/<page>.md``) name one that exists. The checker is shown to fail on a
broken link and a broken anchor, so a page moved or a heading renamed is caught here.

No subprocess, no network: reads the Markdown files only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
#: ``[text](target)`` and ``![alt](target)``; the target stops at whitespace or ``)``.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
#: Folders that hold no project text (environments, installed packages, build outputs).
SKIPPED_DIRS = {"node_modules", "cdk.out", "build", "__pycache__"}
SOURCE_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".txt", ".toml", ".json", ".js"}


def pages(root: Path = ROOT) -> list[Path]:
    """README.md and every page under docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """Line number and line of ``text`` outside fenced code blocks."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        match = FENCE.match(line)
        if match:
            if fence is None:
                fence = match.group(1)
            elif match.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text without Markdown, lower-cased, every character
    but letters, digits, ``_``, ``-`` and spaces dropped, spaces turned into ``-``."""
    text = INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in "_- ")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub gives the headings of ``path`` (a repeated slug gets ``-1``, ``-2``...)."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> Iterator[tuple[int, str]]:
    """Line number and target of every link in ``path``'s prose (code spans and blocks left out)."""
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            yield number, match.group(1)


def broken_links(files: list[Path], root: Path) -> list[str]:
    """One line per relative link or anchor in ``files`` that leads nowhere."""
    problems: list[str] = []
    cache: dict[Path, set[str]] = {}
    for path in files:
        where = path.relative_to(root)
        for number, target in links(path):
            if not target or EXTERNAL.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                problems.append(f"{where}:{number}: {target}: no file {file_part}")
                continue
            if anchor:
                if dest.suffix != ".md" or dest.is_dir():
                    problems.append(f"{where}:{number}: {target}: an anchor into a file that is not a page")
                    continue
                if anchor not in cache.setdefault(dest, anchors(dest)):
                    problems.append(f"{where}:{number}: {target}: no heading #{anchor} in {dest.relative_to(root)}")
    return problems


def source_files(root: Path) -> Iterator[Path]:
    """The project's own text files (hidden folders, environments and build outputs left out)."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS)
        for name in sorted(files):
            path = Path(folder) / name
            if path.suffix in SOURCE_SUFFIXES or name == "Makefile" or name == "Dockerfile":
                yield path


def test_every_link_and_anchor_of_the_docs_resolves() -> None:
    files = pages()
    assert len(files) > 2, "docs/ has no pages"
    assert broken_links(files, ROOT) == []


def test_the_readme_links_every_docs_page() -> None:
    readme_targets = {target.partition("#")[0] for _, target in links(ROOT / "README.md")}
    missing = [p.name for p in pages()[1:] if f"docs/{p.name}" not in readme_targets]
    assert missing == [], f"README.md does not link to {missing}"


def test_every_docs_page_a_source_file_names_exists() -> None:
    named = re.compile(r"\bdocs/([A-Za-z0-9_-]+\.md)\b")
    problems = []
    for path in source_files(ROOT):
        if path == Path(__file__).resolve():
            continue  # its own examples of broken links
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in named.finditer(text):
            if not (ROOT / "docs" / match.group(1)).is_file():
                problems.append(f"{path.relative_to(ROOT)}: docs/{match.group(1)}")
    assert problems == []


def test_the_checker_fails_on_a_broken_link_and_a_broken_anchor(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "# A page\n\n## Raw text in: `inputs: text`\n\n## Twice\n\n## Twice\n\n"
        "[up](../README.md#quick-start) [self](#twice-1) [code](#raw-text-in-inputs-text)\n"
        "```\n[not a link](nowhere.md)\n```\n`[not a link either](nowhere.md)`\n",
        encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "# Title\n\n## Quick start\n\n[ok](docs/page.md#twice) [gone](docs/missing.md) "
        "[bad anchor](docs/page.md#no-such-heading) [web](https://example.com/x.md)\n",
        encoding="utf-8")
    problems = broken_links(pages(tmp_path), tmp_path)
    assert problems == [
        "README.md:5: docs/missing.md: no file docs/missing.md",
        "README.md:5: docs/page.md#no-such-heading: no heading #no-such-heading in docs/page.md",
    ]


def test_slugs_follow_githubs_rules() -> None:
    assert slug("Raw text in: `inputs: text`") == "raw-text-in-inputs-text"
    assert slug("The local endpoint (real Triton, SageMaker MME API)") == "the-local-endpoint-real-triton-sagemaker-mme-api"
    assert slug("What `make demo` does and prints") == "what-make-demo-does-and-prints"
    assert slug("Big builds: incremental, in parallel") == "big-builds-incremental-in-parallel"
    assert slug("The runtime / tools boundary") == "the-runtime--tools-boundary"
    assert slug("A team's own policy") == "a-teams-own-policy"
