"""The server under test as a process we own: start, readiness, stop, cleanup proof.

The server runs in its own session (so its own process group): Ctrl-C in the
terminal reaches tokrecord only, and tokrecord decides how the server dies. Stop
is SIGTERM to the group, SIGKILL after a grace period, then a check that no
process of the group or of the recorded descendants survives and that the port no
longer listens. That check is evidence, not a courtesy.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

import httpx
import psutil
from pydantic import BaseModel, ConfigDict

from tokrecord.engines import Engine
from tokrecord.errors import ConfigError, ServerError

LOG_TAIL_LINES = 40

# Set by tokrecord in the environment of every server it starts: the leg being run.
LEG_ENV = "TOKRECORD_LEG"
# And its run directory: a resume finds a server that a hard kill orphaned by this, even
# when the kill came before the server's pid could be written down.
RUN_DIR_ENV = "TOKRECORD_RUN_DIR"


# tokrecord's own credentials: the server under test never needs them, and a server
# that logs its environment would seal them into server.log (submit.localmaxxing.KEY_ENV).
OWN_CREDENTIAL_ENV = frozenset({"LOCALMAXXING_API_KEY"})


def server_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a server inherits: tokrecord's, less tokrecord's own credentials."""
    return {k: v for k, v in environ.items() if k not in OWN_CREDENTIAL_ENV}


class CleanupReport(BaseModel):
    """What stopping the server left behind."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pid: int
    exit_code: int | None
    exited_before_stop: bool
    sigterm_sent: bool
    sigkill_sent: bool
    stop_seconds: float
    tracked_pids: tuple[int, ...]
    surviving_pids: tuple[int, ...]
    port: int
    port_listening_after: bool

    @property
    def surviving_workers(self) -> int:
        return len(self.surviving_pids)

    @property
    def passed(self) -> bool:
        return not self.surviving_pids and not self.port_listening_after


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def render_argv(template: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """Fill `{port}`, `{host}`, `{model}` placeholders; an unknown one is a config error.

    Only `{identifier}` is a placeholder, so JSON arguments such as
    `--speculative-config '{"method": "ngram"}'` pass through untouched.
    """

    def fill(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            known = ", ".join("{" + k + "}" for k in sorted(values))
            raise ConfigError(
                f"server command has an unknown placeholder {{{key}}} in {match.string!r}; "
                f"known: {known}"
            )
        return values[key]

    return [_PLACEHOLDER.sub(fill, part) for part in template]


def port_is_listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class PortHold:
    """A port tokrecord chose itself, kept bound (never listening) until its server starts.

    Between choosing a free port and the server binding it, a leg writes its inputs, waits
    for the idle gate and starts the sampler: half a second in which another process asking
    the kernel for a free port could be given the same one (four test workers starting
    fake servers were, issue 28). Held, the port is not free to anyone else; the hold is
    released just before the server starts, which leaves only the server's own start-up.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._sock: socket.socket | None = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((host, 0))
        self.port = int(self._sock.getsockname()[1])

    def release(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """Refuse a taken port up front: a stale server there would answer our requests."""
    if port_is_listening(port, host):
        raise ConfigError(
            f"port {port} is already in use on {host}: another server is listening there "
            "(stop it, or choose another --port)"
        )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"port {port} on {host} cannot be used: {exc.strerror}") from exc


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no server log)"
    tail = text.splitlines()[-lines:]
    return "\n".join("    " + line for line in tail) if tail else "    (server log is empty)"


# Words that mark a log line as the cause of a failed start. The first such line is
# quoted: what follows it is usually its consequences ("failed to load model", "exiting").
_ERROR_WORDS = re.compile(
    r"(?i)\b(error|errors|failed|failure|fatal|exception|invalid|cannot|could not|"
    r"no such|not found|unrecognized|unrecognised)\b")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


def error_line(log_text: str, marked: re.Pattern[str] | None = None) -> str | None:
    """The one line of a server log that says why the server failed, or None.

    The first line the engine itself marks as an error (`marked`, from its adapter);
    else a Python traceback's exception; else the first line that reads as an error,
    since later ones follow from it."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    if marked is not None:
        first = next((line for line in lines if marked.search(line)), None)
        if first is not None:
            return first
    tracebacks = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    if tracebacks:
        exceptions = [line for line in lines[tracebacks[-1]:] if _EXCEPTION_LINE.match(line)]
        if exceptions:
            return exceptions[-1]
    return next((line for line in lines if _ERROR_WORDS.search(line)), None)


def log_error_line(path: Path, marked: re.Pattern[str] | None = None) -> str | None:
    try:
        return error_line(path.read_text(encoding="utf-8", errors="replace"), marked)
    except OSError:
        return None


def _error_first(path: Path, marked: re.Pattern[str] | None) -> str:
    line = log_error_line(path, marked)
    return f"\n    error line: {line}\n" if line else "\n"


def resolve_program(name: str, path: str | None = None) -> str | None:
    """Where argv[0] runs from: a path as given, else PATH, else beside the Python that
    runs tokrecord (its venv's bin, where `llama-server` is installed, when the venv was
    not activated)."""
    if os.sep in name:
        candidate = Path(name).expanduser()
        return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None
    found = shutil.which(name, path=path)
    if found is not None:
        return found
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def servers_of_run(run_dir: Path) -> list[psutil.Process]:
    """Live processes whose environment names `run_dir` as theirs (RUN_DIR_ENV)."""
    want = str(run_dir.resolve())
    found = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(RUN_DIR_ENV) == want and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


# Processes are known by identity, a psutil.Process (pid and kernel start time), never
# by a bare pid: a helper of the server that exits and is reaped frees its pid, and an
# unrelated process that takes it must never be counted as ours, nor signalled.
Identity = tuple[int, float]


def _identity(proc: psutil.Process) -> Identity:
    return proc.pid, proc.create_time()


# Linux keeps each thread's children in /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN):
# reading the family from there costs a few small reads, where psutil's children() reads the
# stat file of every process on the machine, and the family is looked at while a server
# starts and stops.
_PROC_CHILDREN = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _kernel_descendants(pid: int) -> list[int]:
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue  # gone meanwhile: so are the children it had
        for tid in tids:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as fh:
                    children = [int(c) for c in fh.read().split()]
            except (OSError, ValueError):
                continue
            found.extend(children)
            todo.extend(children)
    return found


def _family(leader: psutil.Process) -> list[psutil.Process]:
    """The leader and its descendants now (psutil drops children older than a parent,
    so a reused pid is not taken for a child; the kernel's list holds only live ones)."""
    try:
        if not leader.is_running():
            return []
        if not _PROC_CHILDREN:
            return [leader, *leader.children(recursive=True)]
    except psutil.Error:
        return []
    family = [leader]
    for pid in dict.fromkeys(_kernel_descendants(leader.pid)):
        with contextlib.suppress(psutil.Error):
            family.append(psutil.Process(pid))
    return family


def _group(pgid: int, since: float) -> list[psutil.Process]:
    """Members of process group `pgid` started no earlier than its leader: a process
    older than the leader's session cannot have joined it, so an older holder of that
    group number is someone else's."""
    members = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.create_time() >= since:
                members.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def listening_beyond_loopback(procs: Sequence[psutil.Process]) -> list[str]:
    """Each listening socket of these processes bound to more than loopback, as
    "address:port (pid N)": 0.0.0.0, ::, or an interface's own address."""
    found = []
    for proc in procs:
        try:
            # TCP only: a UDP socket never listens, and each kind read is a scan of the
            # host's whole socket table (thousands of TIME_WAIT lines after a test run).
            conns = proc.net_connections(kind="tcp")
        except psutil.Error:
            continue
        for conn in conns:
            if conn.status != psutil.CONN_LISTEN or not conn.laddr:
                continue
            try:
                addr = ipaddress.ip_address(conn.laddr.ip)
            except ValueError:
                continue
            mapped = getattr(addr, "ipv4_mapped", None)
            if not (mapped or addr).is_loopback:
                host = f"[{conn.laddr.ip}]" if addr.version == 6 else conn.laddr.ip
                found.append(f"{host}:{conn.laddr.port} (pid {proc.pid})")
    return sorted(set(found))


def _alive(proc: psutil.Process) -> bool:
    """This very process still runs (False once its pid belongs to another)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


READY_POLL_FIRST_S = 0.01
READY_POLL_LATE_FRACTION = 0.1
# While it starts, the server's process family is learnt (for `stop`) at most this often, and
# once more when it is ready: the first polls are 10 ms apart, and where the kernel keeps no
# children files (_PROC_CHILDREN) each look walks every process on the machine, 5-20 ms of CPU.
FAMILY_TRACK_EVERY_S = 0.2


def ready_poll_wait_s(elapsed_s: float, poll_s: float, left_s: float) -> float:
    """How long to wait before the next readiness poll.

    Polls start READY_POLL_FIRST_S apart and then wait a tenth of the time already
    waited, up to poll_s, never past the deadline: a server is found at most about 10 %
    (and 10 ms) after it became ready, whether that takes 0.1 s (llama.cpp, the fake
    server) or 90 s (vLLM on a CPU); the ready time is evidence. A doubling wait
    overshot by up to half the time waited (a fake ready in 0.65 s was found at 1.13 s).
    """
    wait = min(poll_s, max(READY_POLL_FIRST_S, READY_POLL_LATE_FRACTION * elapsed_s))
    return max(0.0, min(wait, left_s))


class ServerProcess:
    """One server process started for one leg. Use as a context manager."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        port: int,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        stop_grace_s: float = 15.0,
        hold: PortHold | None = None,
    ) -> None:
        if not argv:
            raise ConfigError("server command is empty")
        self.argv = list(argv)
        self.port = port
        self._hold = hold  # released at start, or at stop when it never started
        self.host = host
        self.log_path = log_path
        self.env = dict(env or {})
        self.stop_grace_s = stop_grace_s
        self.base_url = f"http://{host}:{port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._leader: psutil.Process | None = None
        self._log: IO[bytes] | None = None
        self._tracked: dict[Identity, psutil.Process] = {}
        self.cleanup: CleanupReport | None = None
        self.started_ns: int | None = None

    @property
    def create_time(self) -> float | None:
        """The kernel's start time of the server process (tells a reused pid apart)."""
        if self._leader is not None:
            return float(self._leader.create_time())
        try:
            return float(psutil.Process(self.pid).create_time())
        except psutil.Error:
            return None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise ServerError("server was not started")
        return self._proc.pid

    def release_hold(self) -> None:
        """Give back the held port (a leg that ends before its server starts)."""
        if self._hold is not None:
            self._hold.release()

    def start(self) -> None:
        self.release_hold()
        check_port_free(self.port, self.host)
        env = {**server_environ(os.environ), **self.env}
        # Exclusive create: a run dir's server log is evidence and is never replaced.
        self._log = open(self.log_path, "xb")  # noqa: SIM115 - closed in stop()
        # A bare program name not on PATH may be one of the venv's console scripts
        # (`llama-server`): run it from there rather than fail.
        program = self.argv[0]
        if os.sep not in program and shutil.which(program) is None:
            program = resolve_program(program) or program
        try:
            self._proc = subprocess.Popen(
                [program, *self.argv[1:]],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            self._log.close()
            raise ServerError(f"cannot start server {self.argv[0]!r}: {exc.strerror}") from exc
        self.started_ns = time.perf_counter_ns()
        # Unreaped, the child's pid cannot be anyone else's: its identity is taken now.
        try:
            self._leader = psutil.Process(self._proc.pid)
        except psutil.Error:
            self._leader = None  # already gone (and a zombie psutil cannot read)
        self._tracked = {}
        self._track(_family(self._leader) if self._leader is not None else [])

    def _track(self, procs: Sequence[psutil.Process]) -> None:
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                self._tracked.setdefault(_identity(proc), proc)

    def _family_now(self) -> list[psutil.Process]:
        return _family(self._leader) if self._leader is not None else []

    def _signal_group(self, sig: signal.Signals) -> bool:
        """Signal the server's process group, only while its leader is our child and not
        yet reaped: until then its pid, and so the group's number, is not anyone else's."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return False
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def wait_ready(
        self,
        timeout_s: float,
        *,
        model: str | None = None,
        poll_s: float = 0.5,
        on_poll: Callable[[float], None] | None = None,
        engine: Engine,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> float:
        """Poll the engine's ready paths (/health then /v1/models by default; never a
        generation) until each answers.

        Returns seconds from start to ready. Raises ServerError quoting the log
        tail when the process dies or the timeout passes. ``clock`` and ``sleep`` are
        seams for tests (a fake clock times out without waiting).
        """
        proc = self._proc
        if proc is None:
            raise ServerError("server was not started")
        t0 = clock()
        deadline = t0 + timeout_s
        # verify=False: base_url is plain http, so no CA bundle to load (20 ms of CPU a client).
        with httpx.Client(base_url=self.base_url, timeout=5.0, verify=False) as http:
            at, track_due = t0, t0
            while True:
                if at >= track_due:
                    self._track(self._family_now())
                    track_due = at + FAMILY_TRACK_EVERY_S
                code = proc.poll()
                if code is not None:
                    raise ServerError(
                        f"server exited with code {code} before becoming ready "
                        f"(after {clock() - t0:.1f} s)"
                        + _error_first(self.log_path, engine.error_line)
                        + f"    last lines of {self.log_path}:\n"
                        + log_tail(self.log_path)
                    )
                if self._ready(http, model, engine):
                    self._track(self._family_now())
                    return clock() - t0
                now = clock()
                if now >= deadline:
                    raise ServerError(
                        f"server did not become ready within {timeout_s:.0f} s "
                        f"({' and '.join(self.base_url + p for p in engine.ready_paths)})"
                        + _error_first(self.log_path, engine.error_line)
                        + f"    last lines of {self.log_path}:\n"
                        + log_tail(self.log_path)
                    )
                if on_poll is not None:
                    on_poll(now - t0)
                sleep(ready_poll_wait_s(now - t0, poll_s, deadline - now))
                at = now

    def exposed(self) -> list[str]:
        """Where the server's processes listen beyond loopback (empty when only on
        loopback): a server reachable from the network, which a benchmark never needs."""
        self._track(self._family_now())
        return listening_beyond_loopback([p for p in self._tracked.values() if _alive(p)])

    @staticmethod
    def _ready(http: httpx.Client, model: str | None, engine: Engine) -> bool:
        try:
            resp = None
            for path in engine.ready_paths:
                resp = http.get(path)
                if resp.status_code != 200:
                    return False
            if model is not None and engine.models_listed and resp is not None:
                ids = engine.served_models(resp.json())
                if ids is not None and model not in ids:
                    raise ServerError(
                        f"server is up but does not serve model {model!r}; it serves {sorted(ids)}"
                    )
            return True
        except (httpx.TransportError, ValueError):
            return False

    def stop(self) -> CleanupReport:
        """Terminate the whole group and prove nothing survived. Idempotent."""
        if self.cleanup is not None:
            return self.cleanup
        proc = self._proc
        if proc is None:
            raise ServerError("server was not started")
        t0 = time.monotonic()
        pgid = proc.pid  # start_new_session makes the server its group's leader
        since = self.create_time or 0.0
        # Members first, while the leader is surely unreaped (its group number ours).
        self._track([*self._family_now(), *_group(pgid, since)])
        exited_before = proc.poll() is not None
        sigterm = sigkill = False
        if not exited_before:
            sigterm = self._signal_group(signal.SIGTERM)
        deadline = t0 + self.stop_grace_s
        while time.monotonic() < deadline:
            # Keep learning about children: a worker forked during shutdown counts too.
            self._track(self._family_now())
            if proc.poll() is not None and not any(_alive(p) for p in self._tracked.values()):
                break
            time.sleep(0.05)
        if proc.returncode is None:
            self._track(_group(pgid, since))
        stragglers = [p for p in self._tracked.values() if _alive(p)]
        if stragglers:
            sigkill = True
            self._signal_group(signal.SIGKILL)
            for straggler in stragglers:  # descendants that left the group
                # psutil checks the identity before it signals: a reused pid is spared.
                with contextlib.suppress(psutil.Error):
                    straggler.kill()
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        # Reaped children vanish quickly; give the kernel a moment before counting.
        settle = time.monotonic() + 2.0
        survivors = [p for p in self._tracked.values() if _alive(p) and p.pid != os.getpid()]
        while survivors and time.monotonic() < settle:
            time.sleep(0.05)
            survivors = [p for p in survivors if _alive(p)]
        if self._log is not None:
            self._log.close()
        self.cleanup = CleanupReport(
            pid=proc.pid,
            exit_code=code,
            exited_before_stop=exited_before,
            sigterm_sent=sigterm,
            sigkill_sent=sigkill,
            stop_seconds=round(time.monotonic() - t0, 3),
            tracked_pids=tuple(sorted({pid for pid, _ in self._tracked})),
            surviving_pids=tuple(sorted(p.pid for p in survivors)),
            port=self.port,
            port_listening_after=port_is_listening(self.port, self.host),
        )
        return self.cleanup

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release_hold()
        if self._proc is not None:
            self.stop()
