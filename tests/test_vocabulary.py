"""Public names, comments and docstrings speak of papers and methods, not of internal reproduction numbers,
issue numbers, working documents outside the repository or their item numbers."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PATTERN = re.compile(r"seed ?00\d|\bspec (?:A\d|Sec\.|§|item)|spec §|/work/|\bissue \d|\bprinciple \d|\bcaveat \d",
                     re.IGNORECASE)
# the old closed-form names, kept as deprecated aliases of the papers' names (users' scenario files hold them)
ALLOWED = {
    ("netsim/privacy/closed_forms.py", 'DEPRECATED = {"seed000": "pdsl", "seed001": "ldp_online", "seed003": '),
    ("netsim/scenario/schema.py", "the old names seed000, seed001, seed003, seed004 still work"),
    ("netsim/scenario/schema.py", 'when={"closed_form": ("privsgp_vr", "seed004")}'),
}


def hits(root: Path) -> list[str]:
    out = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if PATTERN.search(line) and not any(rel == a and s in line for a, s in ALLOWED):
                out.append(f"{rel}:{n}: {line.strip()}")
    return out


def test_netsim_speaks_of_papers_not_internal_numbers():
    assert hits(ROOT / "netsim") == []


def test_the_pattern_catches_what_it_should():
    for bad in ("seed 003's accountant", "Seed000 (PDSL)", "(spec A12)", "spec §9 item 4", "spec Sec. 5",
                "/work/shared/specs/x.md", "(issue 6)", "principle 4", "caveat 2"):
        assert PATTERN.search(bad), bad
    for ok in ("docs/reproductions/seed-003.md", "spec = sc.privacy", "DataSpec", "Sec. III-B of the paper"):
        assert not PATTERN.search(ok), ok


ALGORITHMS = sorted(p for p in (ROOT / "netsim" / "algorithms").glob("*.py")
                    if p.name not in ("__init__.py", "registry.py"))


@pytest.mark.parametrize("path", ALGORITHMS, ids=lambda p: p.stem)
def test_every_algorithm_module_cites_its_paper_and_equations(path):
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert re.search(r'"[A-Z][^"]{15,}"', doc), "no paper title (in double quotes) in the module docstring"
    assert re.search(r"\b[A-Z][a-z]+(?:,| and| &| et al\.)", doc), "no authors in the module docstring"
    assert re.search(r"\b(?:eqs?\.|Algorithm|Alg\.|Lemma|Theorem)\s*\(?\d", doc) or "[reconstructed]" in doc, \
        "no equation or algorithm number of the paper (nor marked [reconstructed])"


# the user-facing files: scenario files, docs, benchmarks and examples are named and written after papers too; the
# only mentions allowed are the notes on the closed forms' old names, which users' scenario files may still hold
SHIPPED = ("docs", "scenarios", "benchmarks", "examples", "README.md")
OLD_NAME_NOTE = re.compile(r"old names?\b|also seed000/|\(`seed00\d`\)|'seed004'")


def shipped_hits() -> list[str]:
    out = []
    for top in SHIPPED:
        root = ROOT / top
        for f in sorted([root] if root.is_file() else root.rglob("*")):
            if not f.is_file() or f.suffix not in (".md", ".toml", ".py", ".txt", ""):
                continue
            rel = f.relative_to(ROOT).as_posix()
            if PATTERN.search(f.name):
                out.append(f"{rel}: the file's name")
            for n, line in enumerate(f.read_text().splitlines(), 1):
                if PATTERN.search(line) and not OLD_NAME_NOTE.search(line):
                    out.append(f"{rel}:{n}: {line.strip()[:120]}")
    return out


def test_shipped_files_speak_of_papers_not_internal_numbers():
    assert shipped_hits() == []
