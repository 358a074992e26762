"""Every relative markdown link of the documentation resolves: `[text](path#anchor)` in
README.md, docs/*.md and container/README.md names a file that exists and, with an anchor,
a heading of that file as GitHub slugs it (lowercase, spaces to `-`, punctuation other than
`-` and `_` dropped, a repeated heading's slug suffixed `-1`, `-2`, ...). Pages get split
and headings renamed; a link that no longer lands is what this catches. Likewise every
test, benchmark or module the pages name exists, since the docs give the command behind
each number they state."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.paths import REPO

PAGES = sorted([REPO / "README.md", REPO / "container" / "README.md",
                *(REPO / "docs").glob("*.md")])
# [text](target): text may hold backticks and nested brackets one level deep; a target
# is what GitHub takes as a link, up to the first space or closing parenthesis.
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1)[^\n])+?\1")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
# A file or folder of the repository named in prose (`tests/host/test_x.py`, `container/k8s/`):
# a top folder, then a path whose last part has a suffix or ends in `/`, so that a ratio
# ("guestfs/LXCFS") is not one. `<key>`, `{a,b}` and `*` are patterns, expanded by glob.
REPO_PATH = re.compile(
    r"(?<![\w/.$<-])((?:tests|benchmarks|guestfs|container|docs|\.ci)/[\w./*<>{},-]*"
    r"(?:\.[\w*]+|/))(?![\w/])")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup gone, lowercase, every character that is not
    a letter, digit, space, `-` or `_` dropped, spaces to `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link keeps its text
    text = text.replace("`", "").lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def prose(page: Path) -> str:
    """A page's text with its fenced code blocks blanked (line numbers kept)."""
    out, fenced = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        fence = bool(FENCE.match(line))
        out.append("" if fenced or fence else line)
        fenced ^= fence
    return "\n".join(out)


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings; a repeated heading's slug gets -1, -2, ..."""
    out: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(page).splitlines():
        if match := HEADING.match(line):
            base = slug(match.group(1))
            count = seen.get(base, 0)
            out.add(f"{base}-{count}" if count else base)
            seen[base] = count + 1
    return out


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every relative link of a page, its text possibly running
    over lines: none in a code block or code span (GitHub shows those as text), none with
    a scheme (https:, mailto:)."""
    text = prose(page)
    spans = [m.span() for m in CODE_SPAN.finditer(text)]
    out = []
    for match in LINK.finditer(text):
        inside = any(a <= match.start() < b for a, b in spans)
        target = match.group(1)
        if not inside and not re.match(r"[a-z][a-z0-9+.-]*:", target):
            out.append((text.count("\n", 0, match.start()) + 1, target))
    return out


def shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def broken(page: Path, target: str) -> str | None:
    """Why target, written in page, does not resolve; None if it does."""
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists():
        return f"no file {shown(dest)}"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"no heading with anchor #{anchor} in {shown(dest)}"
    return None


def test_slug_follows_githubs_rules():
    assert slug("Capabilities under Kubernetes") == "capabilities-under-kubernetes"
    assert slug("Every podman/CRI-O container: the OCI hook") == \
        "every-podmancri-o-container-the-oci-hook"
    assert slug("How `run` starts its daemon") == "how-run-starts-its-daemon"
    assert slug("Start-up of `guestfs run`") == "start-up-of-guestfs-run"
    assert slug("The CPU clock: what top, vmstat, mpstat and htop divide") == \
        "the-cpu-clock-what-top-vmstat-mpstat-and-htop-divide"
    assert slug("a_b (c) 1.2") == "a_b-c-12"


def test_repeated_headings_get_numbered_anchors(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# A\n## Notes\n```\n# not a heading\n```\n## Notes\n## Notes\n")
    assert anchors(page) == {"a", "notes", "notes-1", "notes-2"}


def test_a_link_to_a_missing_heading_or_file_is_reported(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("## Here\n[ok](#here) [bad](#there) [gone](q.md) `[code](#x)` "
                    "[`run`](p.md#here) [web](https://example.org/#y) [over a\nline](#here)"
                    "\n```\n[fenced](#x)\n```\n")
    assert links(page) == [(2, "#here"), (2, "#there"), (2, "q.md"), (2, "p.md#here"),
                           (2, "#here")]
    assert broken(page, "#here") is None
    assert broken(page, "p.md#here") is None
    assert broken(page, "#there") == f"no heading with anchor #there in {page}"
    assert broken(page, "q.md") == f"no file {tmp_path / 'q.md'}"


def missing_paths(page: Path) -> list[tuple[int, str]]:
    """(line number, path) of every repository path a page names that matches no file,
    looked up from the repository's root and from the page's folder."""
    out = []
    for number, line in enumerate(prose(page).splitlines(), 1):
        for match in REPO_PATH.finditer(line):
            name = match.group(1)
            if "<" in name or "{" in name:
                continue
            pattern = name.rstrip("/")
            if not any(next(root.glob(pattern), None) for root in (REPO, page.parent)):
                out.append((number, name))
    return out


def test_a_named_path_that_does_not_exist_is_reported(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("`tests/unit/test_doc_links.py`, tests/host/test_faults_*.py, "
                    "`guestfs/render/`, docs/<page>.md, guestfs/LXCFS, /run/guestfs/x.py, "
                    "tests/unit/test_gone.py, benchmarks/bench_gone.py --rounds 5\n")
    assert missing_paths(page) == [(1, "tests/unit/test_gone.py"),
                                   (1, "benchmarks/bench_gone.py")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_named_repository_path_exists(page):
    bad = [f"{page.relative_to(REPO)}:{number}: {name}"
           for number, name in missing_paths(page)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    bad = [f"{page.relative_to(REPO)}:{number}: ({target}) {why}"
           for number, target in links(page) if (why := broken(page, target))]
    assert not bad, "\n".join(bad)
