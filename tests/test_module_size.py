"""Every module of ``simgpu/`` stays near 500 lines, or says why it does not.

A module is split along its seams once it passes about 500 lines. One that stays longer (one class
whose methods keep the same state in step, say) says why in its module docstring, in a sentence
with the words of :data:`PHRASE` ("This file stays above 500 lines: ..."). :data:`LIMIT` leaves a
little room above 500, so that a line or two more does not force a split.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "simgpu"
#: Lines a module may have without saying why.
LIMIT = 520
#: The words a longer module's docstring holds, in the sentence that says why it stays long.
PHRASE = "above 500 lines"


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _says_why(path: Path) -> bool:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return PHRASE in " ".join(doc.split())


def test_every_module_is_short_or_says_why() -> None:
    long = [(p, _lines(p)) for p in sorted(PACKAGE.rglob("*.py")) if _lines(p) >= LIMIT]
    bad = [f"  {p.relative_to(PACKAGE.parent)}: {n} lines" for p, n in long if not _says_why(p)]
    assert not bad, (f"modules of {LIMIT} lines or more whose docstring does not say why (a sentence with "
                     f"{PHRASE!r}); split them along their seams or say why:\n" + "\n".join(bad))


def test_the_phrase_is_found_across_line_breaks(tmp_path: Path) -> None:
    module = tmp_path / "long.py"
    module.write_text('"""A module.\n\nThis file stays above\n500 lines: one class."""\n' + "x = 1\n" * LIMIT)
    assert _lines(module) > LIMIT and _says_why(module)
    module.write_text('"""A module."""\n' + "x = 1\n" * LIMIT)
    assert not _says_why(module)
