"""The server: its event log, its engine-style counters and /metrics, its lifecycle."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from tokrecord.errors import ConfigError
from tokrecord.server.fake.config import FakeServerConfig
from tokrecord.server.fake.constants import FINISH_REASONS
from tokrecord.server.fake.dialects import DIALECTS
from tokrecord.server.fake.dialects.base import render_metrics
from tokrecord.server.fake.handler import _Handler
from tokrecord.server.fake.tokens import _dumps, chunk_plan
from tokrecord.server.httpd import LocalHTTPServer


class _EventLog:
    """The server's own JSONL record of what it sent; one flushed line per event."""

    def __init__(self, path: Path | None) -> None:
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        if path is not None:
            try:
                self._file = path.open("x", encoding="utf-8")
            except FileExistsError as exc:
                raise ConfigError(
                    f"fake server: log file {path} exists; it is never overwritten"
                ) from exc
            except OSError as exc:
                raise ConfigError(f"fake server: cannot create log file {path}: {exc}") from exc

    def write(self, record: Mapping[str, object]) -> None:
        if self._file is None:
            return
        line = _dumps(record) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class _Counters:
    """Cumulative engine-style counters since start; each dialect names them on /metrics."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generation_tokens = 0
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted = 0
        self.active = 0
        self.max_active = 0
        # Booked once per request, after its last write (llama.cpp's timings and decodes).
        self.prompt_seconds = 0.0
        self.predicted_seconds = 0.0
        self.decode_calls = 0
        self.accepted_per_pos: list[int] = []

    def book_request(self, config: FakeServerConfig, sent: int) -> None:
        """A generation's prompt and decode time, on the fake's schedule."""
        plan = chunk_plan(sent, config.tokens_per_chunk)
        with self.lock:
            self.prompt_seconds += config.ttft_ms / 1e3
            self.predicted_seconds += sent / config.tok_s
            self.decode_calls += len(plan)
            if config.tokens_per_chunk > 1:
                if not self.accepted_per_pos:
                    self.accepted_per_pos = [0] * (config.tokens_per_chunk - 1)
                for chunk in plan[1:]:
                    for pos in range(len(chunk) - 1):
                        self.accepted_per_pos[pos] += 1

    def book_warmup(self, prompt_tokens: int, cached: int, generated: int) -> None:
        """A generation the engine ran by itself (SGLang's startup warmup)."""
        with self.lock:
            self.prompt_tokens += prompt_tokens
            self.cached_tokens += cached
            self.generation_tokens += generated
            self.success["length"] += 1


class _PrefixCache:
    """The engine's prefix cache, as far as the fake needs one: the previous prompt."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: tuple[int, ...] = ()

    def lookup(self, ids: tuple[int, ...], enabled: bool) -> int:
        """Leading tokens shared with the previous prompt (one is always evaluated)."""
        with self._lock:
            last, self._last = self._last, ids
        if not enabled:
            return 0
        shared = 0
        for a, b in zip(last, ids, strict=False):
            if a != b:
                break
            shared += 1
        return min(shared, max(len(ids) - 1, 0))

    def flush(self) -> None:
        with self._lock:
            self._last = ()


class FakeServer(LocalHTTPServer):
    """The HTTP server with its counters and log; `serve` runs one in the foreground."""

    daemon_threads = True

    def __init__(self, config: FakeServerConfig) -> None:
        self.config = config
        self.dialect = DIALECTS[config.dialect]
        self.counters = _Counters()
        self.prefix_cache = _PrefixCache()
        self.events = _EventLog(config.log)
        self.request_numbers = itertools.count()
        self.started_ns = time.perf_counter_ns()
        self.started_wall = time.time()
        if ":" in config.host:
            self.address_family = socket.AF_INET6
        try:
            super().__init__((config.host, config.port), _Handler)
        except BaseException:
            self.events.close()
            raise
        self.dialect.on_start(self)

    def server_close(self) -> None:
        super().server_close()
        self.events.close()

    @property
    def url(self) -> str:
        host = self.config.host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.server_port}"

    def ready(self) -> bool:
        if self.config.never_ready:
            return False
        return time.perf_counter_ns() - self.started_ns >= self.config.ready_after_s * 1e9

    def metrics_text(self) -> str:
        return render_metrics(self.dialect.metrics(self))
