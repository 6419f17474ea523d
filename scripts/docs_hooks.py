"""MkDocs hooks (mkdocs.yml, ``hooks:``): the README is the site's home page, so ``make docs`` checks its links
as it checks the pages'; and a table's code spans read as on GitHub.

The README links to the pages as ``docs/page.md``, as GitHub shows the repository; on the site they are the
home page's neighbours, so the prefix goes and MkDocs checks each link and its anchor. A link to another file
of the repository points at that file on GitHub once it is known to exist here; one to a missing file is a
warning, which ``mkdocs build --strict`` turns into a failure.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# A Markdown link or image target: ](target) or ](target#anchor), no title.
LINK = re.compile(r"\]\(([^)\s#]*)(#[^)\s]*)?\)")
CODE_SPAN = re.compile(r"`[^`]*`")

log = logging.getLogger("mkdocs.hooks.readme")


def home_page(readme: str, repo_url: str) -> str:
    """``readme`` with its links made the site's."""

    def link(match: re.Match[str]) -> str:
        target, anchor = match[1], match[2] or ""
        if not target or "://" in target or target.startswith("mailto:"):
            return match[0]
        if target.startswith("docs/"):
            return f"]({target.removeprefix('docs/')}{anchor})"
        path = REPO / target
        if not path.exists():
            log.warning("README.md links to %s, which is not in the repository", target)
            return match[0]
        kind = "tree" if path.is_dir() else "blob"
        return f"]({repo_url.rstrip('/')}/{kind}/main/{target}{anchor})"

    return LINK.sub(link, readme)


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "README.md", content=home_page(README.read_text(), config["repo_url"])))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """GitHub splits a table's row at a pipe even inside a code span unless it is escaped (`a \\| b`, as
    scripts/parameter_tables.py writes the types); Python-Markdown keeps such a span whole and would show
    the backslash."""

    def unescape(match: re.Match[str]) -> str:
        return match[0].replace("\\|", "|")

    lines = markdown.split("\n")
    return "\n".join(CODE_SPAN.sub(unescape, line) if line.startswith("|") else line for line in lines)
