"""Issue 31, finding 5: a markdown report carries no HTML, link or image from evidence."""

from __future__ import annotations

from paths import FIXTURES as FIXTURES_DIR
from tokrecord.report import load_report, render_markdown

DEMO = FIXTURES_DIR / "report" / "demo"
SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(1)>"
LINK = "[click](https://evil.example/x)"


def test_values_from_evidence_are_escaped() -> None:
    d = load_report(DEMO, verify=False)
    hostile = d.model_copy(update={
        "title": f"{SCRIPT} | {LINK}",
        "submissions": (f"{IMG} ![x](https://evil.example/p.png) \x1b[2K",),
    })
    md = render_markdown(hostile)
    for raw in ("<script", "<img", "](https://evil", "\x1b"):
        assert raw not in md, raw
    assert "&lt;script&gt;alert(1)&lt;/script&gt; \\| [click]\\(https://evil.example/x)" in md
