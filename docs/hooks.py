"""mkdocs hook: the repository's own Markdown files as pages of the documentation site.

README.md, FORMAT.md, CHANGELOG.md and benchmarks/README.md stay where a reader of the
repository looks for them; the site takes them as they are. Every page's relative links are
written against the repository's tree, so the same file reads right on a forge and on the
site. This hook resolves each one against the tree and rewrites it for the site: a link to one
of these pages or to a page of docs/ goes to that page; an image goes to a copy of it; a link
to any other file of the repository (source, benchmark results) becomes the file's path as
code, since the site does not serve the tree; a link to nothing is left as it is, for mkdocs
to report.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parent.parent
DOCS = "docs"
PAGES = {  # repository path -> page of the site
    "README.md": "index.md",
    "FORMAT.md": "format.md",
    "CHANGELOG.md": "changelog.md",
    "benchmarks/README.md": "benchmarks.md",
}
IMAGES = (".png", ".svg", ".jpg", ".gif")
COPIES = "repo"  # images from outside docs/ are copied under this folder of the site
LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)


def _repo_path(page_uri: str) -> str:
    for repo, uri in PAGES.items():
        if uri == page_uri:
            return repo
    return f"{DOCS}/{page_uri}"


def _outside_fences(text: str, fn: Any) -> str:
    """Apply fn to the parts of text outside fenced code blocks."""
    out, pos = [], 0
    for m in FENCE.finditer(text):
        out += [fn(text[pos:m.start()]), m.group(0)]
        pos = m.end()
    return "".join([*out, fn(text[pos:])])


def _resolve(repo_src: str, url: str) -> tuple[str, str] | None:
    """The repository path a relative link points at, and its #fragment; None for an absolute URL."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", url) or url.startswith(("#", "/")):
        return None
    path, _, fragment = url.partition("#")
    target = posixpath.normpath(posixpath.join(posixpath.dirname(repo_src), path))
    return target.rstrip("/"), fragment


def _site_uri(target: str, files: Files) -> str | None:
    """Where the site serves a repository path, if it does."""
    if target in PAGES:
        return PAGES[target]
    if target.startswith(f"{DOCS}/") and files.get_file_from_path(target[len(DOCS) + 1:]) is not None:
        return target[len(DOCS) + 1:]
    if target.endswith(IMAGES) and (ROOT / target).is_file():
        return f"{COPIES}/{target}"
    return None


def _images(repo_src: str, text: str) -> set[str]:
    found: set[str] = set()
    for _, _, url in LINK.findall(text):  # shown (![...]) or linked to
        resolved = _resolve(repo_src, url)
        if resolved and not resolved[0].startswith(f"{DOCS}/") and resolved[0].endswith(IMAGES):
            found.add(resolved[0])
    return found


def on_files(files: Files, config: Any) -> Files:
    images: set[str] = set()
    for repo, uri in PAGES.items():
        text = (ROOT / repo).read_text(encoding="utf-8")
        files.append(File.generated(config, uri, content=text))
        images |= _images(repo, text)
    for f in list(files):
        if f.src_uri.endswith(".md") and f.abs_src_path and Path(f.abs_src_path).is_relative_to(ROOT / DOCS):
            images |= _images(f"{DOCS}/{f.src_uri}", Path(f.abs_src_path).read_text(encoding="utf-8"))
    for image in sorted(images):
        if (ROOT / image).is_file():
            files.append(File.generated(config, f"{COPIES}/{image}", abs_src_path=str(ROOT / image)))
    return files


def on_page_markdown(markdown: str, page: Page, config: Any, files: Files) -> str:
    repo_src = _repo_path(page.file.src_uri)

    def rewrite(match: re.Match[str]) -> str:
        bang, text, url = match.groups()
        resolved = _resolve(repo_src, url)
        if resolved is None:
            return match.group(0)
        target, fragment = resolved
        uri = _site_uri(target, files)
        if uri is None and not (ROOT / target).exists():
            return match.group(0)  # broken: left for mkdocs to report
        if uri is None:  # a file of the tree the site does not serve: name it
            name = f"`{target}`"
            return name if text.strip("`").rstrip("/") in (target, posixpath.basename(target)) else f"{text} ({name})"
        rel = posixpath.relpath(uri, posixpath.dirname(page.file.src_uri) or ".")
        return f"{bang}[{text}]({rel}{'#' + fragment if fragment else ''})"

    return _outside_fences(markdown, lambda part: LINK.sub(rewrite, part))
