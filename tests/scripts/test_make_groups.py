"""`make test-fast` runs its serial group on the modules a grep in the Makefile finds
(`SERIAL_MODULES`), not on the whole suite: every test marked serial must be in one of them,
or it would run in neither group."""

from __future__ import annotations

import ast
import re

from paths import ROOT


def _serial_modules_pattern() -> re.Pattern[str]:
    line = next(t for t in (ROOT / "Makefile").read_text().splitlines()
                if t.startswith("SERIAL_MODULES ="))
    found = re.search(r"grep -rlE '([^']+)' tests --include='test_\*\.py'", line)
    assert found, line
    return re.compile(found.group(1), re.MULTILINE)


def _marks_serial(text: str) -> bool:
    """Any `pytest.mark.serial` in the module's code: decorator, pytestmark or param marks."""
    return any(isinstance(n, ast.Attribute) and n.attr == "serial"
               and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"
               for n in ast.walk(ast.parse(text)))


def test_every_module_marking_a_test_serial_is_in_the_serial_group() -> None:
    pattern = _serial_modules_pattern()
    texts = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
             for p in (ROOT / "tests").rglob("test_*.py")}
    marking = sorted(name for name, text in texts.items() if _marks_serial(text))
    assert marking, "no serial test found: the search itself is wrong"
    missed = [name for name in marking if not pattern.search(texts[name])]
    assert missed == [], f"marked serial, but the Makefile's grep misses them: {missed}"


def test_the_check_sees_a_mark_the_grep_does_not_spell() -> None:
    # So the check above can fail: a mark given through pytest.param is found by the AST
    # walk and not by the Makefile's grep.
    text = ("import pytest\n\n@pytest.mark.parametrize('x', "
            "[pytest.param(1, marks=pytest.mark.serial)])\ndef test_x(x):\n    pass\n")
    assert _marks_serial(text)
    assert not _serial_modules_pattern().search(text)
