"""The README is a page for users and the docs stay true to the code: the README is at most 250
lines and starts with the two commands; every relative link of README.md, CHANGELOG.md and
docs/*.md reaches a file (and a heading, when it names one); docs/*.md cite no issue numbers
(history lives in CHANGELOG.md); every command of the README's command table is a real
subcommand with the options it shows, and every subcommand is in the table; every ``make``
target the README names exists; the README's ``train.precision`` choices are the trial's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_LINES = 250

#: an issue cited by number: "issue 27", "(issue 13.2)", "issues 13 and 14", across a line break
ISSUE_CITATION = re.compile(r"\bissues?\s+\d+", re.IGNORECASE)
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks (a link or heading inside one is not one)."""
    return FENCE.sub("", text)


def github_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown page's headings: lower case, characters other than
    word characters, hyphens and spaces dropped, spaces as hyphens, repeats suffixed -1, -2, ...

    >>> sorted(github_anchors("# A b\\n## `x` (y; z)\\n## A b\\n"))
    ['a-b', 'a-b-1', 'x-y-z']
    """
    seen: dict[str, int] = {}
    anchors = set()
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", _prose(text), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Relative links of ``page`` whose file does not exist, or whose ``#anchor`` names no
    heading of the Markdown file it points to; each as ``page: target`` (``page`` relative to
    ``root``)."""
    broken = []
    for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path) if path else page
        if not dest.exists():
            broken.append(f"{page.relative_to(root)}: {target} (no such file)")
        elif (
            anchor
            and dest.suffix == ".md"
            and anchor not in github_anchors(dest.read_text(encoding="utf-8"))
        ):
            broken.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return broken


def test_the_readme_is_short_and_starts_with_the_two_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README.md: expected ≤ {MAX_LINES} lines, found {len(lines)}"
    assert lines[0] == "```bash"
    assert lines[1].startswith("make quickstart   # ")
    assert lines[2].startswith("make test         # ")
    assert lines[3] == "```"


def test_every_relative_link_reaches_a_file_and_heading() -> None:
    pages = [README, ROOT / "CHANGELOG.md", *DOCS]
    assert len(DOCS) >= 8
    assert [b for page in pages for b in broken_links(page)] == []


def test_a_broken_link_is_found(tmp_path) -> None:
    (tmp_path / "b.md").write_text("# Here it is\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#here-it-is) [web](https://x.org/y) [gone](c.md) [no](b.md#there)")
    assert broken_links(page, tmp_path) == [
        "a.md: c.md (no such file)",
        "a.md: b.md#there (no such heading)",
    ]


def test_the_docs_cite_no_issue_numbers() -> None:
    cited = [
        f"{page.name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()!r}"
        for page in DOCS
        for text in [page.read_text(encoding="utf-8")]
        for m in ISSUE_CITATION.finditer(text)
    ]
    assert cited == [], "docs/ cite issue numbers (history goes to CHANGELOG.md)"


@pytest.mark.parametrize(
    "text",
    ["before issue 27 it", "(issue 13.2)", "issues 13 and 14", "Issue 14 asks", "issue\n29"],
)
def test_an_issue_citation_is_recognised(text: str) -> None:
    assert ISSUE_CITATION.search(text)


def _command_table() -> list[str]:
    """The first column of the README's command table, one entry per row."""
    section = README.read_text(encoding="utf-8").split("## The command line\n")[1].split("\n## ")[0]
    return [ln.split(" | ")[0] for ln in section.splitlines() if ln.startswith("| `calibtune ")]


def _help(*argv: str) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "calibtune", *argv, "--help"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert res.returncode == 0, (argv, res.stderr[-2000:])
    return res.stdout


def test_the_command_table_matches_the_cli() -> None:
    rows = _command_table()
    assert rows, "README.md: expected a command table under '## The command line'"
    shown: set[str] = set()
    for row in rows:
        for usage in re.findall(r"`(calibtune [^`]+)`", row):
            words = usage.split()
            cmd = words[1:3] if words[1] == "data" else words[1:2]
            shown.add(words[1])
            help_text = _help(*cmd)
            for option in re.findall(r"(?<![\w-])--[a-z][a-z-]*", usage):
                assert re.search(rf"(?<![\w-]){option}(?![\w-])", help_text), (usage, option)
    # `calibtune --help` lists each subcommand indented by four spaces under COMMAND
    subcommands = set(re.findall(r"^    ([a-z]+)\b", _help(), re.MULTILINE))
    assert subcommands and subcommands <= shown, subcommands - shown


def test_every_make_target_the_readme_names_exists() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, re.MULTILINE))
    named = set(re.findall(r"`make ([a-z][a-z-]*)", README.read_text(encoding="utf-8")))
    named |= {"quickstart", "test"}
    assert named - targets == set()


def test_the_readme_names_the_trials_precisions() -> None:
    from calibtune.trial._config import PRECISIONS

    shown = re.search(r"`train\.precision: ([a-z0-9 |]+)`", README.read_text(encoding="utf-8"))
    assert shown, "README.md: expected `train.precision: fp32 | ...` in the GPU section"
    assert tuple(c.strip() for c in shown.group(1).split("|")) == PRECISIONS
