"""The telemetry sampler: the process a leg starts beside its server (`TelemetrySampler` in
probes.telemetry), writing one snapshot per interval to telemetry.jsonl until its stdin closes.

It imports only the probes and the canonical JSON writer, never pydantic: it starts once per
leg, and its start-up is CPU taken beside the server under test."""

from __future__ import annotations

import argparse
import os
import select
import sys
import time
from pathlib import Path
from typing import Any

from tokrecord.evidence import canonical_json

from . import Snapshot, detect


def sample_line(snapshot: Snapshot, epoch_ns: int, t_ns: int) -> dict[str, Any]:
    """One telemetry.jsonl line: leg-clock time, host figures, device readings."""
    host = snapshot.host.as_json(frozenset({"busy_processes"}))
    devices = [d.as_json(frozenset({"processes"})) for d in snapshot.devices]
    return {"t_ns": t_ns - epoch_ns, "host": host, "devices": devices}


def _sampler_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tokrecord.probes.sampler")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--epoch-ns", type=int, required=True)
    args = parser.parse_args(argv)
    # Telemetry needs no process scan (that is the idle gate's job), and the scan
    # would be the sampler's main CPU cost, paid beside the server under test.
    probes = detect(scan_processes=False)
    header = args.out.with_name(args.out.stem + ".probes.json")
    header.write_bytes(canonical_json({"backends": probes.backends, "notes": probes.notes,
                                       "pid": os.getpid(), "interval_s": args.interval}) + b"\n")
    with open(args.out, "ab") as fh:
        def sample() -> None:
            t_ns = time.perf_counter_ns()
            fh.write(canonical_json(sample_line(probes.snapshot(), args.epoch_ns, t_ns)) + b"\n")
            fh.flush()

        next_t = time.perf_counter()
        while True:
            sample()
            next_t += args.interval
            wait = max(0.0, next_t - time.perf_counter())
            ready, _, _ = select.select([sys.stdin], [], [], wait)
            if ready and not os.read(sys.stdin.fileno(), 4096):
                # EOF: the client is done. One last sample closes the suite window, so
                # an energy counter can be read at both its ends.
                sample()
                break
    probes.close()
    return 0


if __name__ == "__main__":
    sys.exit(_sampler_main())
