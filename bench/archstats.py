"""Architecture figures for a checkout: folder cycles, imports inside functions, `.get("`
calls, the longest functions and the files that spell out summary.json; then issue 30's
measures of one evidence model (see `_issue30`).

    .venv/bin/python -m bench.archstats [REPO]      # default: this checkout

Figures, not a test: issue 14's and issue 30's before and after (run it on two checkouts).
"""

from __future__ import annotations

import ast
import re
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
    _issue30(root, funcs)
    return 0


# The gates a leg or an experiment records, by the names their results carry. Spelled
# here on purpose: the measure must count the same names on a checkout without a registry.
_GATE_NAMES = frozenset({
    "teacher_exact", "cross_leg_exact", "cached_tokens_zero", "full_output_then_next",
    "long_context_then_next", "rollover", "token_count_integrity", "fresh_unique_prompts",
    "single_active_generation", "no_warmup_generation", "one_suite_invocation", "zero_retries",
    "first_valid_score_is_reported_score", "cleanup", "treatment_attestation", "idle_before",
    "idle_after", "clocks_stable",
})
_RECORD_FORMS = re.compile(r"\b(ExperimentRecord\w*|SingleLegRecord\w*)\b")
_DESIGN_BRANCH = re.compile(r"Design\.(SINGLE|AA|ABBA)\b|\.design\s*(==|!=|is\b|in\b)")
_MIGRATION = "record/migrate.py"  # where issue 30 puts load-time upgrades


def _issue30(root: Path, funcs: list[tuple[int, str]]) -> None:
    """Issue 30's targets, each a count over src/tokrecord; lower is better for every one.
    A gate name counts wherever it is a whole string constant (a `g.name == "..."`, a
    label table's key, a record key named after the gate); a design branch is a
    `Design.SINGLE/AA/ABBA` or a comparison on `.design` outside experiment/plan.py; a
    place that derives a leg's results is a function that calls evaluate_gates."""
    any_dicts = 0
    compat: list[str] = []
    isinstances: list[str] = []
    derives: list[str] = []
    gate_files: dict[str, int] = {}
    design_files: list[str] = []
    noqa = 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        src = path.read_text(encoding="utf-8")
        tree = ast.parse(src)
        any_dicts += src.count("dict[str, Any]")
        noqa += src.count("noqa: E402")
        if _DESIGN_BRANCH.search(src) and rel not in ("experiment/plan.py", "experiment/design.py"):
            design_files.append(rel)
        names = sum(1 for n in ast.walk(tree) if isinstance(n, ast.Constant)
                    and isinstance(n.value, str) and n.value in _GATE_NAMES)
        if names:
            gate_files[rel] = names
        for node in ast.walk(tree):
            if rel != _MIGRATION:
                if isinstance(node, ast.Assign | ast.AnnAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    compat += [f"{rel}:{t.id}" for t in targets if isinstance(t, ast.Name)
                               and t.id.lstrip("_").startswith("ADDED_")]
                if isinstance(node, ast.If | ast.IfExp) and "legacy" in {
                        n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}:
                    compat.append(f"{rel}:{node.lineno} legacy")
            if (rel.startswith(("report/", "submit/")) and isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                    and len(node.args) == 2 and _RECORD_FORMS.search(ast.unparse(node.args[1]))):
                isinstances.append(f"{rel}:{node.lineno}")
            if isinstance(node, ast.FunctionDef) and node.name != "evaluate_gates" and any(
                    isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                    and c.func.id == "evaluate_gates" for c in ast.walk(node)):
                derives.append(f"{rel}:{node.name}")
    long = sorted((f for f in funcs if f[0] > 60), reverse=True)
    print()
    print("issue 30 measures (lower is better):")
    print(f"  dict[str, Any] annotations in src/: {any_dicts}")
    print(f"  ADDED_* sets and legacy branches outside {_MIGRATION}: {len(compat)} {compat}")
    print(f"  reader-side isinstance on record forms in report/, submit/: {len(isinstances)} "
          f"{isinstances}")
    print(f"  places that derive a leg's results (call evaluate_gates): {len(derives)} {derives}")
    print(f"  files naming a gate as a string literal: {len(gate_files)} {gate_files}")
    print(f"  files outside the design module that branch on the design: {len(design_files)} "
          f"{design_files}")
    print(f"  functions longer than 60 lines in src/: {len(long)} {[n for _, n in long]}")
    print(f"  noqa: E402: {noqa}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
