"""`tokrecord report DIR`: a terminal summary, a markdown summary and one HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from tokrecord.report import (
    default_paths,
    load_report,
    print_report,
    render_html,
    render_markdown,
    write_text,
)
from tokrecord.report.browser import screenshot as take_screenshot

from .app import _guard, app, err_console, out_console
from .view import RichReportObserver


def write_report(
    directory: Path,
    *,
    html: Path | None = None,
    markdown: Path | None = None,
    leg: str | None = None,
    row: str | None = None,
    verify: bool = True,
    screenshot: Path | None = None,
    print_summary: bool = True,
) -> tuple[Path, Path]:
    """Build the report of a sealed directory, write HTML and markdown beside it (never
    inside: it is sealed), print the summary and where the files are; their paths."""

    default_html, default_md = default_paths(directory)
    html_path, md_path = html or default_html, markdown or default_md
    with RichReportObserver(err_console) as progress:
        data = load_report(directory, leg=leg, row=row, verify=verify, observer=progress)
        progress.report_step("rendering the HTML page and the markdown summary")
        page = render_html(data)
        write_text(html_path, page)
        write_text(md_path, render_markdown(data))
        if screenshot is not None:

            progress.report_step(f"full-page screenshot with headless Chromium → {screenshot}")
            take_screenshot(html_path, screenshot)
    if print_summary:
        print_report(out_console, data)
    kib = len(page.encode("utf-8")) / 1024
    out_console.print(f"report: {escape(str(html_path.resolve()))} ({kib:,.0f} KiB, self-contained; "
                      "open it in any browser, offline)", soft_wrap=True)
    out_console.print(f"markdown: {escape(str(md_path.resolve()))}", soft_wrap=True)
    if screenshot is not None:
        out_console.print(f"screenshot: {escape(str(screenshot.resolve()))}", soft_wrap=True)
    return html_path, md_path


@app.command()
@_guard
def report(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Sealed experiment or leg directory.")],
    html: Annotated[
        Path | None, typer.Option(help="HTML page to write (default: <DIR>.report.html, beside DIR).")
    ] = None,
    markdown: Annotated[
        Path | None, typer.Option(help="Markdown summary to write (default: <DIR>.report.md).")
    ] = None,
    leg: Annotated[
        str | None, typer.Option(help="Leg of the per-token timeline (default: the first candidate leg).")
    ] = None,
    row: Annotated[
        str | None,
        typer.Option(help="Row (index or id) of the timeline (default: most multi-token chunks)."),
    ] = None,
    verify: Annotated[
        bool, typer.Option(help="Run tokrecord verify and show its result in the report.")
    ] = True,
    screenshot: Annotated[
        Path | None, typer.Option(help="Also write a full-page PNG of the page (needs Chromium).")
    ] = None,
) -> None:
    """Summarise a record: in the terminal, as markdown, and as one self-contained HTML page."""
    write_report(directory, html=html, markdown=markdown, leg=leg, row=row, verify=verify,
                 screenshot=screenshot)
