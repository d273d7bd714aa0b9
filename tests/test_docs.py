"""The documentation is true to the repository: the README stays a front door, every relative link
resolves, every `docs/<file>.md §<heading>` a file cites exists, and nothing speaks of how the work
was organised (the repository describes itself, not its to-do list)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORK_ITEM = r"\b" + "iss" + r"ue('s)? ?[0-9]*\b|d" + r"one[- ]when"  # spelled apart: this file would match


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [REPO / line for line in out.splitlines() if (REPO / line).is_file()]


def headings(path: Path) -> set[str]:
    return {m.group(1).strip() for m in re.finditer(r"^#+ (.+)$", path.read_text(), re.M)}


def test_the_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    assert "tunelab run" in "\n".join(lines) and "import tunelab" in "\n".join(lines)


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for doc in tracked("README.md", "docs/*.md", "docs/**/*.md"):
        text = re.sub(r"```.*?```|`[^`\n]*`|^    [^\n]*$", "", doc.read_text(), flags=re.S | re.M)  # code is not a link
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#", 1)[0]
            if path and not re.match(r"[a-z]+://|mailto:", path) and not (doc.parent / path).exists():
                broken.append(f"{doc.relative_to(REPO)} -> {target}")
    assert not broken


def test_every_cited_docs_section_exists():
    missing = []
    for path in tracked("*.py", "*.yaml", "*.md", "Makefile"):
        for doc, section in re.findall(r"docs/([\w/.-]+\.md) §([^;,)\n`\"]+)", path.read_text(errors="replace")):
            cited = section.strip().rstrip(".:")
            known = headings(REPO / "docs" / doc) if (REPO / "docs" / doc).is_file() else set()
            if not cited.startswith("<") and not any(h.startswith(cited) or cited.startswith(h) for h in known):
                missing.append(f"{path.relative_to(REPO)}: docs/{doc} §{section.strip()}")
    assert not missing


def test_nothing_speaks_of_work_items():
    hits = [f"{p.relative_to(REPO)}: {line.strip()}" for p in tracked() if p.suffix not in (".png", ".ipynb", ".jsonl")
            for line in p.read_text(errors="replace").splitlines() if re.search(WORK_ITEM, line, re.I)]
    assert not hits
