"""Architecture figures for a checkout: folder cycles, imports inside functions, `.get("`
calls, the longest functions and the files that spell out summary.json.

    .venv/bin/python -m bench.archstats [REPO]      # default: this checkout

Figures, not a test: issue 14's before and after (run it on two checkouts).
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path


def _stage(rel: Path) -> str:
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else ".") / "src" / "tokrecord"
    edges: dict[str, set[str]] = defaultdict(set)
    deferred = 0
    gets: dict[str, int] = {}
    funcs: list[tuple[int, str]] = []
    summary: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        src = path.read_text(encoding="utf-8")
        if "summary.json" in src:
            summary.append(rel.as_posix())
        if rel.as_posix() != "record/lint.py" and src.count('.get("'):
            gets[rel.as_posix()] = src.count('.get("')
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                funcs.append(((node.end_lineno or node.lineno) - node.lineno + 1,
                              f"{rel.as_posix()}:{node.name}"))
                deferred += sum(1 for sub in ast.walk(node)
                                if isinstance(sub, ast.Import | ast.ImportFrom))
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tokrecord."):
                target = (node.module or "").split(".")[1]
                if target != _stage(rel):
                    edges[_stage(rel)].add(target)

    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for nxt in edges[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    cycles = sorted({tuple(sorted((a, b))) for a in list(edges) for b in edges[a] if a in reach(b)})
    print("folder cycles:", cycles or "none")
    print("imports inside functions:", deferred)
    print('.get(" outside lint:', sum(gets.values()),
          dict(sorted(gets.items(), key=lambda kv: -kv[1])[:10]))
    print("longest functions:", sorted(funcs, reverse=True)[:6])
    print("files naming summary.json:", len(summary), summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
