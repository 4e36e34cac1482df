"""Reports people would rather look at than read.

    load_report(DIR) -> ReportData          the only part that reads files (load.py)
    render_terminal / print_report          the terminal summary (rich)       (text.py)
    render_markdown                         for a pull request or forum post  (text.py)
    render_html                             one self-contained, offline page  (html.py)

A report is derived, never evidence: it is written beside the sealed directory
(`<DIR>.report.html`, `<DIR>.report.md`), which it never touches.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .html import render_html
from .load import NullReportObserver, ReportObserver, load_report
from .model import SCHEMA_REPORT, ReportData
from .text import print_report, render_markdown, render_terminal

__all__ = [
    "SCHEMA_REPORT",
    "NullReportObserver",
    "ReportData",
    "ReportObserver",
    "default_paths",
    "load_report",
    "print_report",
    "render_html",
    "render_markdown",
    "render_terminal",
    "write_text",
]


def default_paths(directory: Path) -> tuple[Path, Path]:
    """Beside the directory, which is sealed read-only: <DIR>.report.html and .md."""
    base = directory.resolve() if directory.name in ("", ".", "..") else directory
    return (base.with_name(base.name + ".report.html"), base.with_name(base.name + ".report.md"))


def write_text(path: Path, text: str) -> Path:
    """Write whole or not at all (a report is regenerated, so it may be replaced)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
