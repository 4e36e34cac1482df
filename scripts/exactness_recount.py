"""Recount teacher exactness of sealed experiments under the rule each was sealed with
(rule 1: leg gates v1) and under today's (rule 2), from their raw events; evidence is
only read. Usage: python scripts/exactness_recount.py EXPERIMENT_DIR..."""

from __future__ import annotations

import sys
from pathlib import Path

from tokrecord.record.recount import recount


def main(argv: list[str]) -> int:
    for arg in argv:
        print(f"{arg}")
        print("  leg  rows  before: gate, rows by ids  after: gate, rows by ids, "
              "ids compared / tokens, ids held back")
        for c in recount(Path(arg)):
            print(f"  {c.leg:<4} {c.rows:>4}  {c.before.status.value} {c.before.count}, "
                  f"{c.by_ids_before}/{c.rows}  {c.after.status.value} {c.after.count}, "
                  f"{c.by_ids_after}/{c.rows}, {c.ids_compared_after}/{c.ids_total}, "
                  f"{c.ids_held_back}")
            print(f"       after: {c.after.reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
