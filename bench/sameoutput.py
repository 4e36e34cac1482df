"""Before/after check that a refactor changed no output: for every fixture, write what
`lint`, `verify`, the three reports and the LocalMaxxing payload builder produce (or the
error they raise) to one file each, then diff two runs.

    # the sealed examples and the A/A captures, untarred outside the repo:
    mkdir -p /tmp/so/h200 /tmp/so/aa
    for f in examples/h200/exp-*.tar.gz; do tar xzf $f -C /tmp/so/h200; done
    for f in /work/shared/fixtures/h200-aa/*.tar.gz; do tar xzf $f -C /tmp/so/aa; done
    PYTHONPATH=<other checkout>/src .venv/bin/python -m bench.sameoutput /tmp/so/before /tmp/so
    .venv/bin/python -m bench.sameoutput /tmp/so/after /tmp/so
    diff -r /tmp/so/before /tmp/so/after

Figures, not a test (issue 30: "reports and payloads of all fixtures byte-identical").
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path

import tokrecord
from tokrecord.record.lint import lint_record
from tokrecord.record.verify import verify_dir
from tokrecord.report import load_report, render_html, render_markdown, render_terminal
from tokrecord.submit.facts import facts_from_dir
from tokrecord.submit.localmaxxing import build_payload
from tokrecord.submit.target import PayloadOptions

REPO = Path(__file__).resolve().parents[1]
OPTIONS = (PayloadOptions(hf_id="meta-llama/Llama-3.2-1B"), PayloadOptions(),
           PayloadOptions(hf_id="x/y", quantization="fp16", model_revision="r1"))
RENDER: dict[str, Callable[..., str]] = {"md": render_markdown, "html": render_html,
                                         "term": render_terminal}


def _save(out: Path, name: str, make: Callable[[], object]) -> None:
    try:
        got = make()
    except Exception as exc:  # the failure is output too: it must not change either
        got = "ERROR " + "".join(traceback.format_exception_only(exc))
    text = got if isinstance(got, str) else json.dumps(got, indent=1, sort_keys=True, default=str)
    (out / name).write_text(text)


def _lint(path: Path) -> str:
    return "\n".join(str(p) for p in lint_record(json.loads(path.read_text())))


def _verify(directory: Path) -> str:
    return "\n".join(str(p) for p in verify_dir(directory))


def _report(directory: Path, render: Callable[..., str]) -> str:
    return render(load_report(directory, verify=False))


def _payload(directory: Path, options: PayloadOptions) -> object:
    built = build_payload(facts_from_dir(directory), options)
    return {"payload": built.payload, "derivation": built.derivation, "warnings": built.warnings}


def main(argv: list[str]) -> int:
    out, untarred = Path(argv[0]), Path(argv[1])
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    print("tokrecord from", tokrecord.__file__)
    dirs = {"v1": REPO / "tests/fixtures/v1-record/abba",
            "v2-blocks2": REPO / "tests/fixtures/report/v2-blocks2",
            "v2-aa": REPO / "tests/fixtures/report/v2-aa", "demo": REPO / "tests/fixtures/report/demo",
            "h200-draft": untarred / "h200/exp-draft", "h200-graphs": untarred / "h200/exp-graphs",
            "aa-plain": untarred / "aa/exp-plain", "aa-draft": untarred / "aa/exp-draft"}
    for seed in sorted((REPO / "tests/fixtures/seeds").glob("*.json")):
        _save(out, f"lint-seed-{seed.stem}.txt", partial(_lint, seed))
    for name, d in dirs.items():
        if (d / "record.json").exists():
            _save(out, f"lint-{name}.txt", partial(_lint, d / "record.json"))
        _save(out, f"verify-{name}.txt", partial(_verify, d))
        for kind, render in RENDER.items():
            _save(out, f"report-{name}.{kind}", partial(_report, d, render))
        for i, opts in enumerate(OPTIONS):
            _save(out, f"payload-{name}-{i}.json", partial(_payload, d, opts))
    for f in sorted(out.iterdir()):
        print(hashlib.sha256(f.read_bytes()).hexdigest()[:16], f.name, f.stat().st_size)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
