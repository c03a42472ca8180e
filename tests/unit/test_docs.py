"""The README and the pages of docs/ hold together: every page is linked from the README,
and every link between them reaches a file and, with an anchor, a heading there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(page: Path) -> set[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", page.read_text())  # no '#' lines of code blocks
    return {anchor(m) for m in re.findall(r"(?m)^#{1,6} (.+)$", text)}


def links(page: Path) -> list[str]:
    text = re.sub(r"(?ms)^\s*```.*?^\s*```", "", page.read_text())
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_every_page_of_docs_is_linked_from_the_readme() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README)}
    unlinked = [p.name for p in PAGES if p.resolve() not in linked]
    assert not unlinked, f"docs/ pages the README does not link: {unlinked}"


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_every_link_reaches_its_file_and_heading(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif fragment and file.suffix == ".md" and fragment not in headings(file):
            broken.append(f"{target}: no heading #{fragment} in {file.name}")
    assert not broken, f"broken links in {page.name}:\n" + "\n".join(broken)
