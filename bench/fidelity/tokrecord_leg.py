"""Run one tokrecord leg against the fake server, in a process of its own.

A process of its own so that its CPU time is tokrecord's alone (the bench's
bookkeeping and the fake server, a child of the leg, are not in RUSAGE_SELF), as
for every peer. Writes one JSON file with the leg's summary figures and CPU times:
the whole process (interpreter start and imports included), the leg (`run_leg`:
server start and stop, rows, gates, result files) and the rows alone (from the
first byte of a request to its trace, i.e. the token loop).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from tokrecord.engines import EngineName
from tokrecord.experiment.leg import LegConfig, NullObserver, RowRecord, ServerSpec, run_leg
from tokrecord.metrics import Convention
from tokrecord.suite import Suite, SuiteRow

FAKE_MODEL = "tokrecord-fake"


class _RowClock(NullObserver):
    """Sums process CPU time over the rows (the token loop and its parsing)."""

    def __init__(self) -> None:
        self.rows_cpu_s = 0.0
        self._t0 = 0.0

    def row_started(self, index: int, row: SuiteRow, total: int) -> None:
        self._t0 = time.process_time()

    def row_finished(self, index: int, record: RowRecord) -> None:
        self.rows_cpu_s += time.process_time() - self._t0


def suite_for(prompts: list[dict[str, str]], max_tokens: int) -> Suite:
    return Suite(
        name="fidelity", sha256="0" * 64,
        rows=tuple(SuiteRow(id=p["id"], prompt=p["prompt"], max_tokens=max_tokens) for p in prompts),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="the leg's run directory")
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--headline", default=Convention.CONVENTIONAL.value)
    parser.add_argument("--engine", default=None,
                        help="the engine's dialect (default: inferred from the server command)")
    parser.add_argument("server_argv", nargs=argparse.REMAINDER,
                        help="after --: the fake server command ({port} is filled in)")
    args = parser.parse_args(argv)
    server_argv = [a for a in args.server_argv if a != "--"]
    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line]
    extra: dict[str, object] = {}
    if "idle" in LegConfig.model_fields:
        # The idle gate waits for a quiet machine before and after the leg; the bench
        # measures the client under whatever load there is (and prints the load).
        extra["idle"] = {"enabled": False}
    config = LegConfig(
        name="fidelity",
        server=ServerSpec(argv=tuple(server_argv), model=FAKE_MODEL, ready_timeout_s=60,
                          stop_grace_s=5),
        suite=suite_for(prompts, args.max_tokens),
        headline=Convention(args.headline),
        engine=EngineName(args.engine) if args.engine else None,
        **extra,  # type: ignore[arg-type]
    )
    clock = _RowClock()
    cpu0 = time.process_time()
    result = run_leg(config, args.out, clock)
    cpu_leg = time.process_time() - cpu0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    config_json = json.loads((args.out / "config.json").read_text())
    args.result.write_text(json.dumps({
        "status": result.status,
        "summary": result.summary.model_dump(mode="json"),
        "epoch_ns": int(config_json["clock"]["epoch_ns"]),
        "cpu_self_s": usage.ru_utime + usage.ru_stime,
        "cpu_leg_s": cpu_leg,
        "cpu_rows_s": clock.rows_cpu_s,
        "run_dir": str(args.out),
    }))
    return 0 if result.status == "complete" else 1


if __name__ == "__main__":
    sys.exit(main())
