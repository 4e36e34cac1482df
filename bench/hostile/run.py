"""Feed `tokrecord verify` and `tokrecord lint` hostile inputs; one line per input.

A small sealed leg is made once with the packaged fake server. Then every file kind of
it is replaced, in a fresh copy each time, by: a symlink to a file outside the evidence
holding a planted marker, a FIFO, a symlink to /dev/zero, invalid UTF-8, 200k levels of
nesting and a 1 GB sparse file (the last three re-sealed with a stranger's key, as
anyone can, so they get past the seal); and a catastrophic log-fact regex, re-sealed.
The same kinds of input go to `lint` as the record. Each command runs in a child with
a 10 s limit; its peak RSS comes from wait4.

Then three hostile servers (bench/hostile/server.py, loopback only) each get a one-row
`tokrecord leg` with a row deadline of ROW_DEADLINE_S and the default byte limit: one
streams forever, one sends a 100 MB line, one never sends its headers. Clean: the leg
fails that row with a limit's message, keeps what arrived (raw-reads.bin), and ends
within the deadline plus 10 s.

Outcomes: `clean refusal` (non-zero exit, no traceback, no marker), `accepted` (exit 0:
wrong for a hostile input), `crash` (a traceback or a signal), `hang` (killed at the
limit), `leak` (the planted marker in the output). Target: every line a clean refusal,
none over 10 s, peak memory under 300 MB.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tokrecord.evidence.seal import MANIFEST_NAME, SIGNATURE_NAME, SigningKey, seal

MARKER = "PLANTED-OUTSIDE-MARKER-5c1e"
LIMIT_S = 10.0  # the target; --limit kills later on a loaded machine (CPU time is shown too)
TARGET_MIB = 300.0
CLI = "import sys; from tokrecord.cli import main; sys.exit(main())"
FAKE = (f"{sys.executable} -m tokrecord.server.fake --host {{host}} --port {{port}} "
        "--model {model} --ttft-ms 5")
IDLE = ("--idle", "interval_s=0.02", "--idle", "consecutive=2", "--idle", "host_cpu_max_pct=100",
        "--idle", "device_util_max_pct=100")


@dataclass(frozen=True)
class Outcome:
    command: str
    target: str
    attack: str
    verdict: str
    seconds: float
    cpu_s: float
    peak_mib: float
    rc: int | None


def run_child(args: list[str], env: dict[str, str], limit_s: float
              ) -> tuple[int | None, str, float, float, float]:
    """(exit code or None when killed at the limit, output, wall seconds, CPU seconds,
    peak RSS MiB). CPU seconds, unlike wall time, barely move with other users' load."""
    with tempfile.TemporaryFile() as out_file:
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", CLI, *args], stdout=out_file,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        rc: int | None = None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() - start > limit_s:
                os.killpg(proc.pid, signal.SIGKILL)
                _, _, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        proc.returncode = rc if rc is not None else -9  # reaped here, not by Popen
        seconds = time.monotonic() - start
        out_file.seek(0)
        output = out_file.read().decode("utf-8", "replace")
    return rc, output, seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0


def judge(rc: int | None, output: str) -> str:
    if rc is None:
        return "hang"
    if MARKER in output:
        return "leak"
    if "Traceback" in output or rc < 0:
        return "crash"
    if rc == 0:
        # A file verify does not interpret, re-sealed by a stranger: the seal holds, and
        # the pass says the key is not pinned. Nothing was read past it.
        return "pass, not pinned" if "(not pinned)" in output else "accepted"
    return "clean refusal"


CLEAN = frozenset({"clean refusal", "pass, not pinned"})
ROW_DEADLINE_S = 5.0
SERVER = Path(__file__).with_name("server.py")
# mode: (the attack, what the leg may say (any one), whether raw-reads.bin must hold bytes)
_LIMITS = ("over the row's byte limit", "past the row's deadline", "more than", "longer than")
SERVERS = {"forever": ("streams forever", _LIMITS, True),
           "line": ("one 100 MB line", _LIMITS, True),
           "no-headers": ("never sends headers", ("past the row's deadline",), False)}


def hostile_servers(work: Path, env: dict[str, str], limit_s: float) -> list[Outcome]:
    """One one-row leg per hostile server mode (see the module's doc)."""
    config = work / "limits.toml"
    config.write_text(f'engine = "vllm"\n[row_limits]\ndeadline_floor_s = {ROW_DEADLINE_S}\n'
                      "deadline_per_token_s = 0.0\n")
    outcomes = []
    for mode, (attack, expected, raw_bytes) in SERVERS.items():
        out = work / f"leg-{mode}"
        cmd = f"{sys.executable} {SERVER} --mode {mode} --host {{host}} --port {{port}}"
        rc, output, secs, cpu, mib = run_child(
            ["leg", "--config", str(config), "--server-cmd", cmd, "--model", "hostile",
             "--rows", "1", "--out", str(out), "--idle", "enabled=false"], env, limit_s)
        verdict = judge(rc, output)
        raw = out / "raw-reads.bin"
        kept = raw.stat().st_size if raw.is_file() else -1
        said = " ".join(output.split())
        if verdict == "clean refusal" and (not any(e in said for e in expected)
                                           or (raw_bytes and kept <= 0)
                                           or secs > ROW_DEADLINE_S + 10):
            verdict = "unclear refusal"
        outcomes.append(Outcome("leg", "server", f"{attack} (row {ROW_DEADLINE_S:g} s)",
                                verdict, secs, cpu, mib, rc))
        print("  " + next((line.strip() for line in output.splitlines()
                           if line.startswith("tokrecord: error")), "(no error line)")[:150],
              flush=True)
        shutil.rmtree(out, ignore_errors=True)
    return outcomes


# ------------------------------------------------------------------------ attacks


def stranger_reseal(directory: Path) -> None:
    for name in (MANIFEST_NAME, SIGNATURE_NAME):
        (directory / name).unlink(missing_ok=True)
    seal(directory, SigningKey(Ed25519PrivateKey.generate()))


def _replace(path: Path) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()


def symlink_out(path: Path, outside: Path) -> None:
    _replace(path)
    path.symlink_to(outside)


def fifo(path: Path, outside: Path) -> None:
    _replace(path)
    os.mkfifo(path)


def dev_zero(path: Path, outside: Path) -> None:
    _replace(path)
    path.symlink_to("/dev/zero")


def bad_utf8(path: Path, outside: Path) -> None:
    _replace(path)
    path.write_bytes(b'{"x": "\xff\xfe\xc0"}\n')


def deep(path: Path, outside: Path) -> None:
    _replace(path)
    path.write_bytes(b"[" * 200_000 + b"]" * 200_000 + b"\n")


def sparse_1g(path: Path, outside: Path) -> None:
    _replace(path)
    with open(path, "wb") as fh:
        fh.truncate(1 << 30)


ATTACKS: dict[str, tuple[Callable[[Path, Path], None], bool]] = {
    # name: (mutation, re-seal afterwards: a seal cannot cover links and FIFOs)
    "symlink to outside": (symlink_out, False),
    "FIFO": (fifo, False),
    "/dev/zero": (dev_zero, False),
    "invalid UTF-8": (bad_utf8, True),
    "deep nesting": (deep, True),
    "1 GB sparse": (sparse_1g, True),
}


def catastrophic_regex(leg: Path) -> None:
    import json

    config = leg / "config.json"
    doc = json.loads(config.read_text())
    doc["leg"]["log_facts"] = [{"name": "redos", "pattern": "(a+)+$", "reduce": "count",
                                "value": "str"}]
    config.write_text(json.dumps(doc))
    with (leg / "server.log").open("a") as fh:
        fh.write("a" * 40 + "b\n")
    stranger_reseal(leg)


# ------------------------------------------------------------------------ the run


def writable_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return dst


def make_leg(work: Path, env: dict[str, str]) -> Path:
    leg = work / "leg"
    proc = subprocess.run([sys.executable, "-c", CLI, "leg", "--server-cmd", FAKE,
                           "--model", "fake", "--rows", "2", "--out", str(leg), *IDLE],
                          env=env, capture_output=True, text=True, check=False)
    # Exit 3: sealed but not valid (no teacher), which is all the verify lines need.
    if proc.returncode not in (0, 3) or not (leg / MANIFEST_NAME).exists():
        raise SystemExit(f"cannot make the sealed leg:\n{proc.stdout}\n{proc.stderr}")
    return leg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", type=Path, default=Path("/work/shared/seeds/abba-experiment-record.json"),
                        help="A record to give lint (the hostile inputs replace it).")
    parser.add_argument("--only", help="Only files whose name contains this.")
    parser.add_argument("--limit", type=float, default=30.0,
                        help="Kill a child after this many wall seconds (a hang).")
    parser.add_argument("--skip-lint", action="store_true")
    parser.add_argument("--skip-servers", action="store_true",
                        help="Leave out the hostile-server lines.")
    parser.add_argument("--only-servers", action="store_true",
                        help="Only the hostile-server lines.")
    parser.add_argument("--part", default="1/1",
                        help="K/N: only every N-th file kind from the K-th (a run under 10 min "
                        "on a loaded machine).")
    args = parser.parse_args(argv)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "TOKRECORD_CONFIG_DIR": str(work / "config")}
        outside = work / "outside-secret.txt"
        outside.write_text(f"{MARKER}\n" * 4)
        leg = make_leg(work, env)
        kinds = sorted(p.name for p in leg.iterdir() if p.is_file())
        if args.only:
            kinds = [k for k in kinds if args.only in k]
        k, parts = (int(x) for x in args.part.split("/"))
        kinds = kinds[k - 1::parts]
        n = 0
        print(f"{'command':<7} {'file':<20} {'attack':<26} {'outcome':<16} {'wall s':>6} "
              f"{'cpu s':>6} {'MiB':>5}", flush=True)

        def record(outcome: Outcome) -> None:
            outcomes.append(outcome)
            print(f"{outcome.command:<7} {outcome.target:<20} {outcome.attack:<26} "
                  f"{outcome.verdict:<16} {outcome.seconds:6.2f} {outcome.cpu_s:6.2f} "
                  f"{outcome.peak_mib:5.0f}", flush=True)

        rc, out, secs, cpu, mib = run_child(["verify", str(leg)], env, args.limit)
        record(Outcome("verify", "(untouched leg)", "baseline", judge(rc, out), secs, cpu, mib,
                       rc))
        if not args.skip_servers:
            for outcome in hostile_servers(work, env, args.limit):
                record(outcome)
        if args.only_servers:
            kinds = []
            args.skip_lint = True

        for kind in kinds:
            for attack, (mutate, reseal) in ATTACKS.items():
                n += 1
                copy = writable_copy(leg, work / f"c{n}")
                mutate(copy / kind, outside)
                if reseal and kind not in (MANIFEST_NAME, SIGNATURE_NAME):
                    stranger_reseal(copy)
                rc, out, secs, cpu, mib = run_child(["verify", str(copy)], env, args.limit)
                record(Outcome("verify", kind, attack + (" (re-sealed)" if reseal else ""),
                               judge(rc, out), secs, cpu, mib, rc))
                shutil.rmtree(copy, ignore_errors=True)
        n += 1
        copy = writable_copy(leg, work / f"c{n}")
        catastrophic_regex(copy)
        if not args.only_servers:
            rc, out, secs, cpu, mib = run_child(["verify", str(copy)], env, args.limit)
            record(Outcome("verify", "config.json", "(a+)+$ log fact (re-sealed)",
                           judge(rc, out), secs, cpu, mib, rc))
        for attack, (mutate, _) in ([] if args.skip_lint else ATTACKS.items()):
            target = work / f"record-{attack.replace(' ', '-').replace('/', '')}.json"
            if args.record.is_file():
                shutil.copy(args.record, target)
            mutate(target, outside)
            rc, out, secs, cpu, mib = run_child(["lint", str(target)], env, args.limit)
            record(Outcome("lint", "record.json", attack, judge(rc, out), secs, cpu, mib, rc))
    bad = [o for o in outcomes[1:] if o.verdict not in CLEAN or o.cpu_s > LIMIT_S
           or o.peak_mib >= TARGET_MIB]
    print(f"{len(outcomes) - 1} inputs: {len(outcomes) - 1 - len(bad)} clean (refused, or "
          f"passed as not pinned) within {LIMIT_S:g} CPU s and {TARGET_MIB:g} MiB; {len(bad)} "
          f"not; load average {os.getloadavg()[0]:.2f}"
          + (": " + ", ".join(f"{o.command} {o.target} {o.attack}: {o.verdict}" for o in bad)
             if bad else ""))
    return 1 if bad else 0
