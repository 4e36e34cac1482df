"""The seed audit: every leaf of the two seed records, found in a real tokrecord record.

    python -m bench.seedaudit [--keep DIR] [--seeds DIR]

Makes an ABBA and a single-leg record on the fake server with every feature the seeds
use (bench/seedaudit/build.py), seals and verifies them, re-accounts the single leg, then
walks each seed's leaves (a list of plain values is one leaf) through bench/seedaudit/
rules.py and prints, per seed, how many are produced, not applicable, or missing, with
every missing one and every not-applicable reason. Exit status 1 when any is missing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.seedaudit.build import make_records
from bench.seedaudit.rules import ABBA, SINGLE, At, NotApplicable, Outcome

SEEDS = Path(__file__).resolve().parents[2].parent / "shared" / "seeds"
_MISSING = object()


def leaves(obj: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict) and obj:
        for k, v in obj.items():
            yield from leaves(v, f"{path}.{k}" if path else k)
    elif isinstance(obj, list) and any(isinstance(x, dict | list) for x in obj):
        for i, v in enumerate(obj):
            yield from leaves(v, f"{path}[{i}]")
    else:
        yield path, obj


def lookup(obj: Any, path: str) -> Any:
    """The value at a dotted path; a key may itself hold dots ("rows.json")."""
    if path == "":
        return obj
    if not isinstance(obj, dict):
        return _MISSING
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        key = ".".join(parts[:i])
        if key in obj:
            found = lookup(obj[key], ".".join(parts[i:]))
            if found is not _MISSING:
                return found
    return _MISSING


def addenda(exp: Path) -> dict[str, dict[str, Any]]:
    """The latest sealed addendum of each kind, beside the experiment directory."""
    out: dict[str, dict[str, Any]] = {}
    base = exp.parent / f"{exp.name}.addenda"
    for path in sorted(base.glob("*/addendum.json")) if base.is_dir() else []:
        data = json.loads(path.read_text())
        out[str(data.get("kind"))] = data
    return out


def resolve(path: str, record: dict[str, Any], adds: dict[str, dict[str, Any]]) -> Any:
    if path.startswith("addendum:"):
        _, kind, rest = path.split(":", 2)
        return lookup(adds[kind], rest) if kind in adds else _MISSING
    return lookup(record, path)


def classify(leaf: str, rules: tuple[tuple[str, Outcome], ...], record: dict[str, Any],
             adds: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """("produced" | "not applicable" | "missing", detail)."""
    for pattern, outcome in rules:
        m = re.fullmatch(pattern, leaf)
        if m is None:
            continue
        if isinstance(outcome, NotApplicable):
            return "not applicable", outcome.reason
        assert isinstance(outcome, At)
        paths = [m.expand(p) for p in outcome.paths]
        absent = [p for p in paths if resolve(p, record, adds) is _MISSING]
        null = [p for p in paths if p not in absent and resolve(p, record, adds) is None]
        if absent:
            return "missing", f"no {', '.join(absent)}"
        if null and not outcome.null_ok:
            return "missing", f"{', '.join(null)} is null"
        detail = ", ".join(paths) + (f" ({outcome.note})" if outcome.note else "")
        return "produced", detail + (f"; null: {outcome.null_ok}" if null else "")
    return "missing", "no rule"


def audit(seed: Path, exp: Path, rules: tuple[tuple[str, Outcome], ...]
          ) -> list[tuple[str, str, str]]:
    record = json.loads((exp / "record.json").read_text())
    adds = addenda(exp)
    return [(leaf, *classify(leaf, rules, record, adds))
            for leaf, _ in leaves(json.loads(seed.read_text()))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.seedaudit", description=__doc__)
    ap.add_argument("--keep", type=Path, help="make the records here (default: a temp dir)")
    ap.add_argument("--seeds", type=Path, default=SEEDS)
    ap.add_argument("--verbose", action="store_true", help="print every leaf")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tokrecord-seedaudit-") as tmp:
        root = args.keep or Path(tmp)
        exps = make_records(root)
        missing = 0
        for seed, exp, rules in (("abba-experiment-record.json", exps["abba"], ABBA),
                                 ("single-leg-record.json", exps["single"], SINGLE)):
            results = audit(args.seeds / seed, exp, rules)
            counts = Counter(kind for _, kind, _ in results)
            missing += counts["missing"]
            print(f"{seed}: {len(results)} leaves: {counts['produced']} produced, "
                  f"{counts['not applicable']} not applicable, {counts['missing']} missing")
            for leaf, kind, detail in results:
                if args.verbose or kind != "produced":
                    print(f"  {kind:>14}  {leaf}: {detail}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
