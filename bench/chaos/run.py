"""Kill it anywhere, lose nothing: a crash-anywhere benchmark of `tokrecord run`.

    make chaos            # or: .venv/bin/python -m bench.chaos [--kills 100] [--seed 1]

A k-block ABBA on the packaged fake server (fast rows: reads well under 2 ms apart,
so no decoding happens inside a row) is run with the same command, `tokrecord run
PLAN --out DIR`, again and again. Most invocations get one SIGKILL at a random
instant, to the harness, to the server's process group or to both; the experiment
is resumed with the same command until it completes. After each completion:

  verify       the final record passes `tokrecord verify`
  resumed      the experiment reached a record at all (no resume was refused, but as
               complete once sealed: a kill that lands while a sealed run exits)
  attempts     every attempt on disk is in the record once, none is missing or doubled
  parse        every JSON file parses; every JSONL line parses, or a torn line is
               named by a `torn_jsonl` event in the state log
  append-only  every file seen after a kill is still there, its bytes a prefix of now
  processes    no server process survives, no port of any attempt still listens
  raw events   no row, completed or cut, lost a chunk the server wrote 20 ms or more
               before the kill (the server's own log is the truth); a cut row is
               marked incomplete (an `end` with ok false); no row of a rows.json
               lacks its successful end
  sealed       a sealed directory does not change: a second run is refused, verify
               writes nothing

Then the other faults, once each: a full disk (a small tmpfs as the run directory,
grown afterwards and resumed), a read-only directory (a read-only mount, fresh and
mid-experiment), the wall clock jumping (a sitecustomize that moves `time.time` by
hours in the harness: nothing else can be done without CAP_SYS_TIME) and a second
`tokrecord run` of the same plan while the first runs.

A benchmark that prints figures, not a test. `--src DIR` runs another tokrecord source
tree (for the figures before a fix). Mounting needs root; without it those faults are
reported as not run.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

from tokrecord.record.verify import verify_dir
from tokrecord.server.process import port_is_listening

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
TRUTH_SERVER = HERE / "truth_server.py"
TRUTH_ENV = "TOKRECORD_CHAOS_TRUTH"
# A chunk written this long before the kill must have reached the client: loopback
# delivers in microseconds, and the 2-core machine may delay a read by milliseconds.
MARGIN_NS = 20_000_000
RECOVERED = "recovered-events.jsonl"
CHECKS = ("verify", "resumed", "attempts", "parse", "append-only", "processes", "raw events",
          "cut rows marked", "half-counted", "sealed")
TARGETS = ("harness", "server", "both")

console = Console(width=140)


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


# ------------------------------------------------------------------------------- the plan


def suite_jsonl(rows: int, max_tokens: int) -> str:
    return "".join(json.dumps({"id": f"row-{i}", "prompt": f"Chaos row {i}: write a parser "
                               f"for case {i}.", "max_tokens": max_tokens}) + "\n"
                   for i in range(rows))


def plan_toml(name: str, blocks: int, rows: int, tok_s: float, idle_gap_s: float) -> str:
    argv = [sys.executable, str(TRUTH_SERVER), "--host", "{host}", "--port", "{port}",
            "--model", "{model}"]
    return "\n".join([
        f'name = "{name}"', 'design = "abba"', f"blocks = {blocks}", 'suite = "suite.jsonl"',
        f"suite_rows = {rows}", f"idle_gap_s = {idle_gap_s:g}", 'teacher = "capture"',
        "[idle]", "interval_s = 0.02", "consecutive = 2", "timeout_s = 30",
        "host_cpu_max_pct = 100", "device_util_max_pct = 100",
        "[telemetry]", "interval_s = 0.25",
        "[server]", f"argv = {json.dumps(argv)}", 'model = "fake-model"',
        "ready_timeout_s = 30", "stop_grace_s = 3",
        "[arms.control]", f'env = {{ TOKRECORD_FAKE_TOK_S = "{tok_s:g}" }}',
        "[arms.candidate]", f'env = {{ TOKRECORD_FAKE_TOK_S = "{tok_s * 1.05:g}" }}',
    ]) + "\n"


@dataclass
class Bench:
    """Where everything of one bench run lives, and how the CLI is started."""

    root: Path
    src: Path | None
    blocks: int
    rows: int
    max_tokens: int
    tok_s: float
    rng: random.Random
    python_path_extra: tuple[str, ...] = ()

    def env(self, truth: Path, extra_path: Sequence[str] = ()) -> dict[str, str]:
        paths = [*extra_path, *([str(self.src)] if self.src else []), str(REPO)]
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COLUMNS": "200",
                "TERM": "dumb", "PYTHONPATH": os.pathsep.join(paths),
                "TOKRECORD_CONFIG_DIR": str(self.root / "key"), TRUTH_ENV: str(truth),
                "HOME": str(self.root / "home")}

    def write_plan(self, name: str, where: Path, idle_gap_s: float = 0.0) -> Path:
        where.mkdir(parents=True, exist_ok=True)
        (where / "suite.jsonl").write_text(suite_jsonl(self.rows, self.max_tokens))
        path = where / "plan.toml"
        path.write_text(plan_toml(name, self.blocks, self.rows, self.tok_s, idle_gap_s))
        return path

    def command(self, plan: Path, exp: Path) -> list[str]:
        return [sys.executable, "-m", "tokrecord", "run", str(plan), "--out", str(exp),
                "--offline-prior"]


# ------------------------------------------------------------------------------ processes


def truth_servers(truth_root: Path) -> list[psutil.Process]:
    """Fake servers started by this bench (their environment names its truth root)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if str(TRUTH_SERVER) in (proc.info["cmdline"] or []) and \
                    proc.environ().get(TRUTH_ENV, "").startswith(str(truth_root)) and \
                    proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def server_groups(harness: int) -> list[int]:
    """Process groups of the servers the harness started (each in its own session)."""
    groups = set()
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(harness).children(recursive=True):
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if str(TRUTH_SERVER) in child.cmdline():
                    groups.add(os.getpgid(child.pid))
    return sorted(groups)


@dataclass
class Outcome:
    rc: int
    target: str | None  # what was killed, None: ran to its end
    t_kill_ns: int | None
    stderr_tail: str
    seconds: float


def invoke(cmd: list[str], env: dict[str, str], log: Path, delay: float | None, target: str,
           timeout: float = 300.0) -> Outcome:
    """One `tokrecord run`, killed `delay` seconds in (None: not killed)."""
    t0 = time.monotonic()
    with open(log, "ab") as fh:
        start = fh.tell()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=fh, env=env, cwd=REPO)
    killed, t_kill = None, None
    try:
        if delay is not None:
            deadline = t0 + delay
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.001)
            if proc.poll() is None:
                groups = server_groups(proc.pid)
                want = target if groups or target == "harness" else "harness"
                t_kill = time.perf_counter_ns()
                if want in ("harness", "both"):
                    os.kill(proc.pid, signal.SIGKILL)
                if want in ("server", "both"):
                    for pgid in groups:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(pgid, signal.SIGKILL)
                killed = want
        rc = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with open(log, "rb") as fh:
        fh.seek(start)
        tail = fh.read().decode(errors="replace")[-2000:]
    return Outcome(rc, killed, t_kill, tail, time.monotonic() - t0)


# ------------------------------------------------------------------------------ snapshots


def files_of(directory: Path) -> Iterator[Path]:
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.is_symlink():
            yield path


def snapshot(directory: Path) -> dict[str, tuple[int, str]]:
    """Every file's size and sha256."""
    out = {}
    for path in files_of(directory):
        with contextlib.suppress(OSError):
            data = path.read_bytes()
            out[str(path.relative_to(directory))] = (len(data), hashlib.sha256(data).hexdigest())
    return out


def append_only_violations(directory: Path, snaps: list[dict[str, tuple[int, str]]]) -> list[str]:
    """Files seen earlier that are gone now or whose earlier bytes are not a prefix of now."""
    bad = []
    for snap in snaps:
        for rel, (size, digest) in snap.items():
            path = directory / rel
            try:
                data = path.read_bytes()
            except OSError:
                bad.append(f"{rel}: gone")
                continue
            if len(data) < size or hashlib.sha256(data[:size]).hexdigest() != digest:
                bad.append(f"{rel}: rewritten")
    return sorted(set(bad))


# ------------------------------------------------------------------------------- checking


def jsonl_lines(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """Parsed lines, and the 1-based numbers of the lines that do not parse (torn).

    The bench's own reading, not tokrecord's `evidence.scan_jsonl`: the check must not
    rely on the code whose files it checks."""
    records, torn = [], []
    data = path.read_bytes()
    lines = data.split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError):
            torn.append(number)
            continue
        if number == len(lines) and not data.endswith(b"\n"):
            torn.append(number)  # no newline: the writer did not finish the line
        elif isinstance(value, dict):
            records.append(value)
    return records, torn


def state_events(exp: Path) -> list[dict[str, Any]]:
    path = exp / "experiment.jsonl"
    return jsonl_lines(path)[0] if path.exists() else []


def parse_problems(exp: Path) -> list[str]:
    """Every JSON file parses; a JSONL line that does not is named in the state log."""
    named = {(e.get("file"), e.get("line")) for e in state_events(exp)
             if e.get("event") == "torn_jsonl"}
    bad = []
    for path in files_of(exp):
        rel = str(path.relative_to(exp))
        if path.suffix == ".json":
            try:
                json.loads(path.read_bytes())
            except (UnicodeDecodeError, json.JSONDecodeError):
                bad.append(f"{rel}: not JSON")
        elif path.suffix == ".jsonl":
            for line in jsonl_lines(path)[1]:
                if (rel, line) not in named:
                    bad.append(f"{rel}:{line}: torn, not named")
    return bad


def attempt_dirs(exp: Path) -> list[Path]:
    return sorted(p for p in exp.glob("*/attempt-*") if p.is_dir())


def attempts_problems(exp: Path, record: dict[str, Any]) -> list[str]:
    listed = [(a.get("leg"), a.get("attempt")) for a in record.get("attempts", [])]
    on_disk = [(p.parent.name, int(p.name.split("-", 1)[1])) for p in attempt_dirs(exp)]
    bad = [f"{leg}/attempt-{n}: listed twice" for leg, n in set(listed) if listed.count((leg, n)) > 1]
    bad += [f"{leg}/attempt-{n}: on disk, not in the record"
            for leg, n in on_disk if (leg, n) not in listed]
    bad += [f"{leg}/attempt-{n}: in the record, not on disk"
            for leg, n in listed if (leg, n) not in on_disk]
    for leg in {leg for leg, _ in on_disk}:
        numbers = sorted(n for lg, n in on_disk if lg == leg)
        if numbers != list(range(1, len(numbers) + 1)):
            bad.append(f"{leg}: attempts {numbers} are not 1..N")
    starts = [(e["leg"], e["attempt"]) for e in state_events(exp) if e.get("event") == "leg_start"]
    ends = [(e["leg"], e["attempt"]) for e in state_events(exp) if e.get("event") == "leg_end"]
    bad += [f"{leg}/attempt-{n}: started {starts.count((leg, n))} times, ended "
            f"{ends.count((leg, n))} times" for leg, n in set(starts)
            if starts.count((leg, n)) != 1 or ends.count((leg, n)) != 1]
    return bad


@dataclass
class RawTally:
    rows_seen: int = 0
    completed_rows: int = 0
    cut_rows: int = 0
    completed_lost: int = 0
    cut_lost: int = 0
    tokens_lost: int = 0
    cut_unmarked: int = 0
    half_counted: int = 0
    details: list[str] = field(default_factory=list)

    def add(self, other: RawTally) -> None:
        for name in ("rows_seen", "completed_rows", "cut_rows", "completed_lost", "cut_lost",
                     "tokens_lost", "cut_unmarked", "half_counted"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.details += other.details


def client_rows(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """The client's kept records per row: events.jsonl, then any recovered events."""
    rows: dict[int, list[dict[str, Any]]] = {}
    for name in ("events.jsonl", RECOVERED):
        path = run_dir / name
        if path.exists():
            for record in jsonl_lines(path)[0]:
                if isinstance(record.get("row"), int):
                    rows.setdefault(record["row"], []).append(record)
    return rows


def truth_for(run_dir: Path, truth: Path) -> list[dict[str, Any]] | None:
    try:
        port = json.loads((run_dir / "config.json").read_text())["port"]
    except (OSError, ValueError, KeyError):
        return None  # killed before the server was chosen: nothing was sent
    logs = sorted(truth.glob(f"{port}-*.jsonl"))
    if not logs:
        return None
    if len(logs) > 1:
        with contextlib.suppress(OSError, ValueError, KeyError):
            pid = json.loads((run_dir / "server.json").read_text())["pid"]
            logs = [p for p in logs if p.stem.endswith(f"-{pid}")] or logs
    return jsonl_lines(logs[-1])[0]


def unmarked_rows(run_dir: Path) -> list[int]:
    """Rows the client began (a request or a chunk kept) that have neither a successful end
    nor an end saying they are incomplete: a cut row must be marked, whoever cut it."""
    out = []
    for row, records in client_rows(run_dir).items():
        began = any(r.get("kind") in ("request", "chunk") for r in records)
        ends = [r.get("ok") for r in records if r.get("kind") == "end"]
        if began and True not in ends and False not in ends:
            out.append(row)
    return out


def raw_tally(exp: Path, truth: Path, kills: list[int], prompts: dict[str, int]) -> RawTally:
    """Per attempt, what the server wrote before the kill against what the client kept."""
    tally = RawTally()
    for run_dir in attempt_dirs(exp):
        sent = truth_for(run_dir, truth)
        if not sent:
            tally.cut_unmarked += len(unmarked_rows(run_dir))
            continue
        rel = str(run_dir.relative_to(exp))
        start = min(int(r["t_ns"]) for r in sent)
        t_kill = next((k for k in sorted(kills) if k > start), None)
        limit = (t_kill - MARGIN_NS) if t_kill is not None else None
        requests = {r["req"]: prompts.get(str((r.get("body") or {}).get("prompt")))
                    for r in sent if r.get("kind") == "request"}
        kept = client_rows(run_dir)
        for req, row in requests.items():
            if row is None:
                continue
            written = [r for r in sent if r.get("kind") == "chunk" and r["req"] == req
                       and (limit is None or r["t_ns"] < limit)]
            done = [r for r in sent if r.get("kind") == "done" and r["req"] == req
                    and r.get("outcome") == "complete" and (limit is None or r["t_ns"] < limit)]
            if not written:
                continue
            records = kept.get(row, [])
            got = sum(int(r.get("n") or 0) for r in records if r.get("kind") == "chunk")
            want = sum(int(r["n"]) for r in written)
            tally.rows_seen += 1
            lost = max(0, want - got)
            if done:
                tally.completed_rows += 1
                tally.completed_lost += lost > 0
            else:
                tally.cut_rows += 1
                tally.cut_lost += lost > 0
            tally.tokens_lost += lost
            if lost:
                tally.details.append(f"{rel} row {row}: {want - got} of {want} tokens lost "
                                     f"({'completed' if done else 'cut'})")
        tally.cut_unmarked += len(unmarked_rows(run_dir))
        rows_json = run_dir / "rows.json"
        if rows_json.exists():
            with contextlib.suppress(OSError, ValueError):
                for stored in json.loads(rows_json.read_text()).get("rows", []):
                    i = stored["trace"]["row"]
                    if not any(e.get("kind") == "end" and e.get("ok") for e in kept.get(i, [])):
                        tally.half_counted += 1
                        tally.details.append(f"{rel} row {i}: in rows.json without its end")
    return tally


def sealed_snapshot(exp: Path) -> dict[str, tuple[str, int, int]]:
    out = {}
    for path in [exp, *sorted(exp.rglob("*"))]:
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        out[str(path.relative_to(exp))] = (digest, st.st_mode, st.st_mtime_ns)
    return out


def sealed_problems(bench: Bench, plan: Path, exp: Path, truth: Path, log: Path) -> list[str]:
    """Nothing in a sealed directory changes: a second run is refused, verify writes nothing."""
    if not (exp / "manifest.sig.json").exists():
        return ["not sealed"]
    before = sealed_snapshot(exp)
    again = invoke(bench.command(plan, exp), bench.env(truth), log, None, "harness")
    bad = [] if again.rc != 0 and "complete" in again.stderr_tail else [
        f"a second run of the completed plan exited {again.rc}"]
    subprocess.run([sys.executable, "-m", "tokrecord", "verify", str(exp)], env=bench.env(truth),
                   cwd=REPO, capture_output=True, timeout=120, check=False)
    after = sealed_snapshot(exp)
    bad += [f"{rel}: changed after sealing" for rel in sorted(before.keys() | after.keys())
            if before.get(rel) != after.get(rel)]
    return bad


def leftover_problems(exp: Path, truth_root: Path) -> list[str]:
    bad = [f"server pid {p.pid} survives" for p in truth_servers(truth_root)]
    for run_dir in attempt_dirs(exp):
        with contextlib.suppress(OSError, ValueError, KeyError):
            port = int(json.loads((run_dir / "config.json").read_text())["port"])
            if port_is_listening(port):
                bad.append(f"port {port} of {run_dir.relative_to(exp)} still listens")
    return bad


def kill_survivors(truth_root: Path) -> None:
    """Between experiments, so one failure does not leak into the next one's counts."""
    for proc in truth_servers(truth_root):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            os.killpg(os.getpgid(proc.pid), signal.SIGKILL)


# ---------------------------------------------------------------------- the kill campaign


@dataclass
class Campaign:
    kills: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TARGETS, 0))
    experiments: int = 0
    completed: int = 0
    invocations: int = 0
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CHECKS, 0))
    examples: dict[str, list[str]] = field(default_factory=dict)
    raw: RawTally = field(default_factory=RawTally)
    seconds: float = 0.0
    after_seal: int = 0  # experiments whose last kill came after their seal

    @property
    def total_kills(self) -> int:
        return sum(self.kills.values())

    def fail(self, check: str, problems: list[str], exp: str) -> None:
        if problems:
            self.failures[check] += 1
            self.examples.setdefault(check, [])
            if len(self.examples[check]) < 4:
                self.examples[check].append(f"{exp}: {'; '.join(problems[:3])}")


COMPLETE_REFUSAL = "is complete; a preregistered plan is run once"


def sealed_before(last: Outcome, exp: Path) -> bool:
    """The kill landed after the experiment was sealed (while the process was exiting):
    the same command then answers that the experiment is complete, which is right. It
    counts as completed, and the checks below still run on it (verify first)."""
    return (last.target is None and last.rc != 0 and COMPLETE_REFUSAL in last.stderr_tail
            and (exp / "manifest.sig.json").exists())


def legs_done(exp: Path) -> int:
    return len([e for e in state_events(exp) if e.get("event") == "leg_end"
                and e.get("status") == "complete"])


def one_experiment(bench: Bench, camp: Campaign, index: int, budget: int, t_full: float | None,
                   total_legs: int) -> float:
    """Run one experiment to completion under kills; returns its clean duration estimate."""
    name = f"chaos-{index:03d}"
    where = bench.root / "exps" / name
    plan = bench.write_plan(name, where)
    exp = where / "exp"
    truth = bench.root / "truth" / name
    truth.mkdir(parents=True, exist_ok=True)
    log = where / "cli.log"
    env = bench.env(truth)
    wanted = 0 if t_full is None else min(budget, bench.rng.randint(1, 6))
    kills: list[int] = []
    snaps: list[dict[str, tuple[int, str]]] = []
    camp.experiments += 1
    t0 = time.monotonic()
    refused = 0
    last: Outcome | None = None
    while True:
        camp.invocations += 1
        delay = None
        target = bench.rng.choice(TARGETS)
        if t_full is not None and len(kills) < wanted:
            remaining = t_full * max(0.15, 1 - legs_done(exp) / total_legs) if exp.exists() \
                else t_full
            delay = bench.rng.uniform(0.0, remaining)
        last = invoke(bench.command(plan, exp), env, log, delay, target)
        if last.target is not None and last.t_kill_ns is not None:
            kills.append(last.t_kill_ns)
            camp.kills[last.target] += 1
            if exp.exists():
                snaps.append(snapshot(exp))
            continue
        if last.rc == 0:
            break
        if sealed_before(last, exp):
            camp.after_seal += 1
            break
        refused += 1  # not killed, and it failed: a server kill's failed leg, or stuck
        if refused > 3:
            break
    seconds = time.monotonic() - t0
    completed = last is not None and (last.rc == 0 or sealed_before(last, exp)) and (
        exp / "record.json").exists()
    camp.fail("resumed", [] if completed else [f"exit {last.rc if last else '?'}: "
                                               f"{(last.stderr_tail if last else '')[-300:]}"], name)
    if completed:
        camp.completed += 1
        camp.fail("verify", [f"{p.file} {p.field}: {p.message}" for p in verify_dir(exp)], name)
        record = json.loads((exp / "record.json").read_text())
        camp.fail("attempts", attempts_problems(exp, record), name)
    if exp.exists():
        camp.fail("parse", parse_problems(exp), name)
        camp.fail("append-only", append_only_violations(exp, snaps), name)
        camp.fail("processes", leftover_problems(exp, bench.root / "truth"), name)
        prompts = {json.loads(line)["prompt"]: i for i, line in
                   enumerate((where / "suite.jsonl").read_text().splitlines())}
        tally = raw_tally(exp, truth, kills, prompts)
        camp.raw.add(tally)
        camp.fail("raw events", [d for d in tally.details if "tokens lost" in d], name)
        camp.fail("cut rows marked", ["a cut row has no incomplete end"] * tally.cut_unmarked,
                  name)
        camp.fail("half-counted", [d for d in tally.details if "without its end" in d], name)
    if completed:
        camp.fail("sealed", sealed_problems(bench, plan, exp, truth, log), name)
    kill_survivors(bench.root / "truth")
    return seconds


def campaign(bench: Bench, kills: int, console: Console) -> Campaign:
    camp = Campaign()
    total_legs = 4 * bench.blocks + 1  # and the teacher
    t0 = time.monotonic()
    console.print("calibrating: one experiment without kills…")
    t_full = one_experiment(bench, camp, 0, 0, None, total_legs)
    console.print(f"  {t_full:.1f} s for {total_legs} legs (teacher included)")
    index = 1
    while camp.total_kills < kills:
        one_experiment(bench, camp, index, kills - camp.total_kills, t_full, total_legs)
        if index % 5 == 0:
            console.print(f"  {index} experiments, {camp.total_kills} kills, "
                          f"{camp.completed} completed, {time.monotonic() - t0:.0f} s, "
                          f"load {load_average()}")
        index += 1
    camp.seconds = time.monotonic() - t0
    return camp


# ---------------------------------------------------------------------------- other faults


@contextlib.contextmanager
def tmpfs(path: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if read_only else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], check=True,
                   capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def remount(path: Path, opts: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{opts}", str(path)], check=True, capture_output=True)


def can_mount(root: Path) -> bool:
    probe = root / "mount-probe"
    try:
        with tmpfs(probe, "1m"):
            return True
    except (subprocess.CalledProcessError, OSError):
        return False


def one_message(out: Outcome) -> bool:
    """One clear message: a `tokrecord: error:` line and no traceback."""
    return "Traceback" not in out.stderr_tail and "tokrecord: error:" in out.stderr_tail


def finish_and_check(bench: Bench, plan: Path, exp: Path, truth: Path, log: Path,
                     checks: dict[str, bool]) -> None:
    out = invoke(bench.command(plan, exp), bench.env(truth), log, None, "harness")
    checks["resumes to a record"] = out.rc == 0
    checks["verifies"] = out.rc == 0 and not verify_dir(exp)
    checks["JSON/JSONL parse or torn lines named"] = not parse_problems(exp)
    checks["no server, no port left"] = not leftover_problems(exp, bench.root / "truth")


def full_disk(bench: Bench, size_bytes: int) -> dict[str, Any]:
    where = bench.root / "faults" / "disk"
    plan = bench.write_plan("chaos-disk", where)
    truth = bench.root / "truth" / "disk"
    truth.mkdir(parents=True, exist_ok=True)
    mnt = where / "mnt"
    size = max(64 * 1024, size_bytes // 2)
    checks: dict[str, bool] = {}
    with tmpfs(mnt, str(size)):
        exp = mnt / "exp"
        out = invoke(bench.command(plan, exp), bench.env(truth), where / "cli.log", None, "harness")
        checks["refused with an error exit"] = out.rc != 0
        checks["one clear message"] = one_message(out)
        checks["message names the full disk"] = "No space left" in out.stderr_tail
        checks["no server, no port left (full)"] = not leftover_problems(exp, bench.root / "truth")
        remount(mnt, "size=256m")
        finish_and_check(bench, plan, exp, truth, where / "cli.log", checks)
        message = out.stderr_tail.strip().splitlines()[-1:] if out.stderr_tail.strip() else []
        kill_survivors(bench.root / "truth")
        shutil.copytree(exp, where / "exp-copy", symlinks=True)
    return {"fault": f"full disk (tmpfs of {size // 1024} KiB, then grown)", "rc": out.rc,
            "message": message[0][:200] if message else "", "checks": checks}


def read_only(bench: Bench) -> dict[str, Any]:
    where = bench.root / "faults" / "ro"
    plan = bench.write_plan("chaos-ro", where)
    truth = bench.root / "truth" / "ro"
    truth.mkdir(parents=True, exist_ok=True)
    checks: dict[str, bool] = {}
    with tmpfs(where / "mnt-fresh", "16m", read_only=True) as mnt:
        out = invoke(bench.command(plan, mnt / "exp"), bench.env(truth), where / "cli.log", None,
                     "harness")
        checks["fresh: error exit"] = out.rc != 0
        checks["fresh: one clear message"] = one_message(out)
        checks["fresh: names the read-only file system"] = "Read-only" in out.stderr_tail
        fresh_rc = out.rc
    rw = where / "rw"
    rw.mkdir(parents=True, exist_ok=True)
    exp = rw / "exp"
    # A kill mid-experiment, then the directory is seen read-only (a read-only bind
    # mount: the orphaned server may still hold its log open), then a resume.
    invoke(bench.command(plan, exp), bench.env(truth), where / "cli.log", 2.5, "harness")
    ro = where / "ro"
    ro.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(rw), str(ro)], check=True, capture_output=True)
    try:
        remount(ro, "bind,ro")
        out = invoke(bench.command(plan, ro / "exp"), bench.env(truth), where / "cli.log", None,
                     "harness")
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False, capture_output=True)
    checks["mid: error exit"] = out.rc != 0
    checks["mid: one clear message"] = one_message(out)
    checks["mid: no server, no port left"] = not leftover_problems(exp, bench.root / "truth")
    finish_and_check(bench, plan, exp, truth, where / "cli.log", checks)
    kill_survivors(bench.root / "truth")
    return {"fault": "read-only directory (a read-only mount: fresh, and after a kill)",
            "rc": [fresh_rc, out.rc], "message": out.stderr_tail.strip().splitlines()[-1][:200]
            if out.stderr_tail.strip() else "", "checks": checks}


SITECUSTOMIZE = '''
"""bench.chaos: the wall clock jumps by hours, back and forth, while the harness runs."""
import time as _time

_real_time, _real_time_ns = _time.time, _time.time_ns
_calls = [0]


def _offset():
    _calls[0] += 1
    k = _calls[0] // 7
    return (-1) ** k * 3600.0 * (k % 3)


def _time_jumping():
    return _real_time() + _offset()


def _time_ns_jumping():
    return _real_time_ns() + int(_offset() * 1e9)


_time.time, _time.time_ns = _time_jumping, _time_ns_jumping
'''


def clock_jumps(bench: Bench) -> dict[str, Any]:
    where = bench.root / "faults" / "clock"
    idle_gap = 1.0
    plan = bench.write_plan("chaos-clock", where, idle_gap_s=idle_gap)
    truth = bench.root / "truth" / "clock"
    truth.mkdir(parents=True, exist_ok=True)
    site = where / "site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    exp = where / "exp"
    env = bench.env(truth, extra_path=[str(site)])
    t0 = time.monotonic()
    try:
        proc = subprocess.run(bench.command(plan, exp), env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=180, check=False)
        rc, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:  # it waits for the wall clock to come back
        rc = None
        stderr = (exc.stderr or b"").decode(errors="replace") if isinstance(
            exc.stderr, bytes) else (exc.stderr or "")
        stderr += "\n(killed after 180 s: still waiting)"
    seconds = time.monotonic() - t0
    checks: dict[str, bool] = {"completes in minutes, not hours": rc == 0}
    checks["verifies"] = rc == 0 and not verify_dir(exp)
    gaps = [e["seconds"] for e in state_events(exp) if e.get("event") == "idle_gap"]
    checks["idle gaps measured right (>= minimum, < minimum + 30 s)"] = bool(gaps) and all(
        idle_gap <= g < idle_gap + 30 for g in gaps)
    stamps_ok, clocks = True, set()
    for run_dir in attempt_dirs(exp):
        with contextlib.suppress(OSError, ValueError, KeyError):
            clocks.add(json.loads((run_dir / "config.json").read_text())["clock"]["source"])
        with contextlib.suppress(OSError, ValueError):
            for row in json.loads((run_dir / "rows.json").read_text())["rows"]:
                t = row["trace"]
                times = [c["t_ns"] for c in t["chunks"]]
                stamps_ok &= (times == sorted(times) and t["t_send_ns"] <= times[0]
                              and times[-1] <= t["t_end_ns"]
                              and t["t_end_ns"] - t["t_send_ns"] < 60e9)
    checks["token stamps monotonic, rows under a minute"] = stamps_ok
    checks["legs name a monotonic clock"] = bool(clocks) and all("MONOTONIC" in c for c in clocks)
    record = (exp / "record.json").read_text() if (exp / "record.json").exists() else ""
    checks["the record names the clock"] = '"clock"' in record and "MONOTONIC" in record
    kill_survivors(bench.root / "truth")
    return {"fault": "wall clock jumping by up to 2 h (time.time in the harness)",
            "rc": rc, "seconds": round(seconds, 1), "idle_gaps_s": gaps,
            "message": (stderr.strip().splitlines() or [""])[-1][:200], "checks": checks}


def second_run(bench: Bench) -> dict[str, Any]:
    where = bench.root / "faults" / "lock"
    plan = bench.write_plan("chaos-lock", where)
    truth = bench.root / "truth" / "lock"
    truth.mkdir(parents=True, exist_ok=True)
    exp = where / "exp"
    env = bench.env(truth)
    with open(where / "first.log", "ab") as fh:
        first = subprocess.Popen(bench.command(plan, exp), stdout=fh, stderr=fh, env=env,
                                 cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
                e.get("event") == "leg_start" for e in state_events(exp)):
            time.sleep(0.02)
        second = subprocess.run(bench.command(plan, exp), env=env, cwd=REPO, capture_output=True,
                                text=True, timeout=240, check=False)
        rc_first = first.wait(timeout=240)
    finally:
        if first.poll() is None:
            first.kill()
    events = state_events(exp)
    open_legs, interleaved = 0, False
    for e in events:
        if e.get("event") == "leg_start":
            interleaved |= open_legs > 0
            open_legs += 1
        elif e.get("event") == "leg_end":
            open_legs -= 1
    checks = {
        "second run refused (error exit)": second.returncode != 0,
        "refused by the lock, one clear message": "Traceback" not in second.stderr
        and second.stderr.count("tokrecord: error:") == 1 and "lock" in second.stderr,
        "no interleaved legs, no resume by the second": not interleaved and not any(
            e.get("event") == "resumed" for e in events),
        "first run completes and verifies": rc_first == 0 and not verify_dir(exp),
        "no server, no port left": not leftover_problems(exp, bench.root / "truth"),
    }
    kill_survivors(bench.root / "truth")
    return {"fault": "a second `tokrecord run` of the same plan while the first runs",
            "rc": [rc_first, second.returncode],
            "message": (second.stderr.strip().splitlines() or [""])[-1][:200], "checks": checks}


# ---------------------------------------------------------------------------------- output


def print_campaign(camp: Campaign) -> None:
    table = Table(title=f"{camp.total_kills} kills ({', '.join(f'{k} {v}' for k, v in camp.kills.items())}), "
                  f"{camp.experiments} experiments, {camp.completed} completed "
                  f"({camp.after_seal} killed after their seal), "
                  f"{camp.invocations} invocations, {camp.seconds:.0f} s",
                  title_justify="left", box=None, padding=(0, 1))
    table.add_column("check")
    table.add_column("experiments failing", justify="right")
    table.add_column("first examples", overflow="fold")
    for check in CHECKS:
        n = camp.failures[check]
        table.add_row(check, ("[red]" if n else "[green]") + str(n),
                      " | ".join(camp.examples.get(check, []))[:400])
    console.print(table)
    r = camp.raw
    console.print(f"rows the server wrote to before a kill: {r.rows_seen} ({r.completed_rows} "
                  f"completed, {r.cut_rows} cut); rows that lost events: {r.completed_lost} "
                  f"completed, {r.cut_lost} cut ({r.tokens_lost} tokens); cut rows not marked "
                  f"incomplete: {r.cut_unmarked}; rows counted without their end: "
                  f"{r.half_counted}", soft_wrap=True)


def print_fault(result: dict[str, Any]) -> None:
    failed = [name for name, ok in result["checks"].items() if not ok]
    console.print(f"[bold]{result['fault']}[/]: exit {result['rc']}; "
                  + (f"[red]{len(failed)} failed:[/] {', '.join(failed)}" if failed
                     else "[green]every check passed[/]"), soft_wrap=True)
    if result.get("message"):
        console.print(f"  message: {result['message']}", soft_wrap=True, markup=False)


def summed(paths: Sequence[Path]) -> int:
    """Add up the campaigns of several results.json (pieces of one long run)."""
    total: dict[str, Any] = {"kills": {}, "failures": {}, "raw": {}}
    for path in paths:
        data = json.loads(path.read_text())
        camp = data["campaign"]
        for key in ("experiments", "completed", "invocations", "seconds", "after_seal"):
            total[key] = total.get(key, 0) + camp.get(key, 0)
        for section in ("kills", "failures", "raw"):
            for k, v in camp[section].items():
                if isinstance(v, int):
                    total[section][k] = total[section].get(k, 0) + v
        console.print(f"{path}: seed {data['seed']}, load {data['load_start']} -> "
                      f"{data['load_end']}")
    console.print(json.dumps(total, indent=1))
    return 0


def recheck_marks(roots: Sequence[Path]) -> int:
    """The `cut rows marked` check over the experiments of earlier runs (it needs no truth)."""
    for root in roots:
        failing, rows = [], 0
        for exp in sorted((root / "exps").glob("*/exp")):
            found = [f"{d.relative_to(exp)} row {r}" for d in attempt_dirs(exp)
                     for r in unmarked_rows(d)]
            rows += len(found)
            if found:
                failing.append(f"{exp.parent.name}: {', '.join(found[:3])}")
        console.print(f"{root}: {len(failing)} experiments failing, {rows} rows not marked"
                      + (f" ({'; '.join(failing[:4])})" if failing else ""), soft_wrap=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=100, help="SIGKILLs in all (default 100)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--blocks", type=int, default=1, help="ABBA blocks (default 1)")
    parser.add_argument("--rows", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--tok-s", type=float, default=2000.0,
                        help="fake server rate (default 2000: reads 0.5 ms apart, a fast row)")
    parser.add_argument("--faults", default="kill,disk,readonly,clock,lock",
                        help="which parts to run (default all)")
    parser.add_argument("--src", type=Path, help="run this tokrecord source tree (a src/ dir)")
    parser.add_argument("--out", type=Path, help="keep everything here (default: a temp dir)")
    parser.add_argument("--sum", type=Path, nargs="+", help="add up earlier results.json")
    parser.add_argument("--recheck-marks", type=Path, nargs="+", metavar="OUT",
                        help="count again, in earlier --out directories, the cut rows that "
                        "are not marked incomplete")
    args = parser.parse_args(argv)
    if args.sum:
        return summed(args.sum)
    if args.recheck_marks:
        return recheck_marks(args.recheck_marks)
    root = args.out or Path(tempfile.mkdtemp(prefix="tokrecord-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    bench = Bench(root=root, src=args.src, blocks=args.blocks, rows=args.rows,
                  max_tokens=args.max_tokens, tok_s=args.tok_s, rng=random.Random(args.seed))
    (root / "home").mkdir(exist_ok=True)
    load_start = load_average()
    console.print(f"bench.chaos: seed {args.seed}, {args.blocks}-block ABBA, {args.rows} rows x "
                  f"{args.max_tokens} tokens at {args.tok_s:g} tok/s; tokrecord from "
                  f"{args.src or REPO / 'src'}; in {root}; load average {load_start}")
    faults = set(args.faults.split(","))
    results: dict[str, Any] = {"seed": args.seed, "args": {k: str(v) for k, v in
                                                           vars(args).items()},
                               "load_start": load_start}
    camp = Campaign()
    if "kill" in faults:
        camp = campaign(bench, args.kills, console)
        print_campaign(camp)
    results["campaign"] = {"kills": camp.kills, "total_kills": camp.total_kills,
                           "experiments": camp.experiments, "completed": camp.completed,
                           "invocations": camp.invocations, "failures": camp.failures,
                           "after_seal": camp.after_seal,
                           "examples": camp.examples, "raw": vars(camp.raw),
                           "seconds": round(camp.seconds, 1)}
    others: list[Callable[[], dict[str, Any]]] = []
    mounts = can_mount(root) if faults & {"disk", "readonly"} else False
    if "disk" in faults and mounts:
        size = sum(p.stat().st_size for p in files_of(root / "exps" / "chaos-000" / "exp")) \
            if (root / "exps" / "chaos-000" / "exp").exists() else 2 * 1024 * 1024
        others.append(lambda: full_disk(bench, size))
    if "readonly" in faults and mounts:
        others.append(lambda: read_only(bench))
    if "clock" in faults:
        others.append(lambda: clock_jumps(bench))
    if "lock" in faults:
        others.append(lambda: second_run(bench))
    if faults & {"disk", "readonly"} and not mounts:
        console.print("[yellow]cannot mount a tmpfs here (not root?): full disk and read-only "
                      "not run[/]")
    results["faults"] = []
    for run in others:
        result = run()
        print_fault(result)
        results["faults"].append(result)
    results["load_end"] = load_average()
    console.print(f"load average {results['load_end']}; everything is in {root}")
    (root / "results.json").write_text(json.dumps(results, indent=1, default=str))
    console.print(f"results: {root / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
