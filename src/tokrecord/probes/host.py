"""The host probe: CPU, memory, other busy processes, and RAPL energy when readable.

It always works (psutil). CPU figures are rates over the interval since the
previous read, so the first read after construction primes the counters.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from .model import HostProcess, HostSample

RAPL_ROOT = Path("/sys/class/powercap")
# A process using at least this share of one core is "busy" and is named.
BUSY_PROCESS_PCT = 10.0


@dataclass(frozen=True)
class RaplDomain:
    name: str
    energy_path: Path
    max_range_uj: int


def rapl_domains(root: Path = RAPL_ROOT) -> list[RaplDomain]:
    """The package-level RAPL domains (intel-rapl:N, name package-N); [] when absent
    or unreadable (non-root on recent kernels: energy_uj is 0400)."""
    found: list[RaplDomain] = []
    if not root.is_dir():
        return found
    for zone in sorted(root.glob("intel-rapl:*")):
        if zone.name.count(":") != 1:  # sub-zones (core, uncore, dram) are inside packages
            continue
        try:
            name = (zone / "name").read_text().strip()
            max_uj = int((zone / "max_energy_range_uj").read_text())
            int((zone / "energy_uj").read_text())
        except (OSError, ValueError):
            continue
        if name.startswith("package"):
            found.append(RaplDomain(name, zone / "energy_uj", max_uj))
    return found


def energy_delta_uj(previous: int, current: int, max_range_uj: int) -> int:
    """Counter difference across at most one wrap."""
    return current - previous if current >= previous else current + max_range_uj - previous


def cpu_freq_mhz() -> float | None:
    """The cores' mean current frequency, or None where it cannot be read (VMs, sandboxes)."""
    try:
        freq = psutil.cpu_freq()
    except (OSError, RuntimeError, NotImplementedError, AttributeError):
        return None
    return round(float(freq.current), 1) if freq is not None and freq.current > 0 else None


class HostProbe:
    name = "host"

    def __init__(self, *, exclude_pids: Sequence[int] = (), rapl_root: Path = RAPL_ROOT,
                 busy_pct: float = BUSY_PROCESS_PCT, scan_processes: bool = True) -> None:
        self._scan = scan_processes
        self._own = {os.getpid(), *exclude_pids}
        self._busy_pct = busy_pct
        self._procs: dict[int, psutil.Process] = {}
        self._rapl = rapl_domains(rapl_root)
        self._energy_uj = 0  # accumulated across wraps since construction
        self._last_raw: list[int] = [self._read_uj(d) for d in self._rapl]
        self._last_t = time.monotonic()
        self._last_energy_uj = 0
        psutil.cpu_percent(interval=None)  # prime: the next call reports since now
        if scan_processes:
            self._busy_processes()

    @staticmethod
    def _read_uj(domain: RaplDomain) -> int:
        return int(domain.energy_path.read_text())

    def _busy_processes(self) -> tuple[HostProcess, ...]:
        # One stat read per process for its CPU time; who owns a busy one is asked only of
        # the busy ones. (psutil's ppid() and children() read every process again, and the
        # idle gate takes a snapshot every interval_s.)
        busy = []
        alive = set()
        for proc in psutil.process_iter():
            pid = proc.pid
            alive.add(pid)
            cached = self._procs.setdefault(pid, proc)
            try:
                pct = cached.cpu_percent(interval=None)
                if pct < self._busy_pct or self._is_own(pid):
                    continue
                busy.append(HostProcess(pid=pid, name=cached.name() or "?",
                                        cpu_pct=round(pct, 1)))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        for gone in set(self._procs) - alive:
            del self._procs[gone]
        return tuple(sorted(busy, key=lambda p: -p.cpu_pct))

    def _is_own(self, pid: int) -> bool:
        """The tool's own processes (this one, the sampler, their descendants) are not
        "other" load, nor is this process's parent; the server under test is excluded by
        the caller's pids. A descendant is found by walking up from it."""
        me = os.getpid()
        if pid in self._own or pid == os.getppid():
            return True
        seen: set[int] = set()
        while pid > 1 and pid not in seen:
            seen.add(pid)
            pid = psutil.Process(pid).ppid()
            if pid == me:
                return True
        return False

    def _rapl_read(self) -> tuple[float | None, float | None]:
        if not self._rapl:
            return None, None
        try:
            raw = [self._read_uj(d) for d in self._rapl]
        except (OSError, ValueError):
            return None, None
        now = time.monotonic()
        self._energy_uj += sum(energy_delta_uj(p, c, d.max_range_uj)
                               for p, c, d in zip(self._last_raw, raw, self._rapl, strict=True))
        dt = now - self._last_t
        power = (self._energy_uj - self._last_energy_uj) / 1e6 / dt if dt > 0 else None
        self._last_raw, self._last_t, self._last_energy_uj = raw, now, self._energy_uj
        return power, self._energy_uj / 1e6

    def read(self) -> HostSample:
        vm = psutil.virtual_memory()
        power, energy = self._rapl_read()
        return HostSample(
            cpu_util_pct=psutil.cpu_percent(interval=None),
            cpu_count=psutil.cpu_count() or 1,
            load1=os.getloadavg()[0],
            mem_used_bytes=vm.total - vm.available,
            mem_total_bytes=vm.total,
            power_w=power,
            energy_j=energy,
            cpu_freq_mhz=cpu_freq_mhz(),
            busy_processes=self._busy_processes() if self._scan else (),
        )

    def close(self) -> None:
        self._procs.clear()
