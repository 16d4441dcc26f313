"""The README and docs/ link to each other by relative links: each must reach a file, and an anchor
where one is given, as GitHub renders them (a moved section must not leave a dead link behind)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_LINK = re.compile(r"\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)[ \t#]*$", re.M)


def _prose(text: str) -> str:
    """The text with fenced blocks and code spans blanked: a link or heading there is not one."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    kept = [c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM"]
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's id in ``path``, with GitHub's -1, -2 … for repeated headings."""
    seen: dict[str, int] = {}
    ids: set[str] = set()
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text())):
        base = github_anchor(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        ids.add(base if n == 0 else f"{base}-{n}")
    return ids


def relative_links(path: Path) -> list[str]:
    return [
        target
        for target in _LINK.findall(_prose(path.read_text()))
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto: …
    ]


def test_github_anchors_are_made_as_github_makes_them() -> None:
    assert github_anchor("Where raftgate differs from etcd") == "where-raftgate-differs-from-etcd"
    assert github_anchor("A curl session (etcd's JSON gateway)") == "a-curl-session-etcds-json-gateway"
    assert github_anchor("Cluster flags (`raftgate store`, named as etcd's)") == (
        "cluster-flags-raftgate-store-named-as-etcds"
    )
    assert github_anchor("Audit log (beyond etcd)") == "audit-log-beyond-etcd"


def test_the_docs_are_found() -> None:
    names = {p.name for p in PAGES}
    assert {"README.md", "operations.md", "configuration.md", "kubernetes.md", "security.md",
            "testing.md", "benchmarks.md", "capacity.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            broken.append(f"{target}: no heading with that anchor in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_docs_page_is_listed_in_the_index_and_linked_from_the_readme() -> None:
    """A page no index names is a page nobody finds."""
    index = set(relative_links(ROOT / "docs" / "README.md"))
    readme = {t.partition("#")[0] for t in relative_links(ROOT / "README.md")}
    assert "docs/README.md" in readme
    for page in (ROOT / "docs").glob("*.md"):
        if page.name != "README.md":
            assert page.name in index, page.name


def test_the_readme_stays_a_five_minute_read() -> None:
    """Issue 23: the README holds the first screen, the architecture and the differences (about 200
    lines); the manual lives in docs/."""
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 210, f"README.md has {lines} lines: move detail into docs/"
