"""The server: its event log, its engine-style counters and /metrics, its lifecycle."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO

from tokrecord.errors import ConfigError
from tokrecord.server.fake.config import FakeServerConfig
from tokrecord.server.fake.constants import FINISH_REASONS
from tokrecord.server.fake.handler import _Handler
from tokrecord.server.fake.tokens import _dumps
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
    """Cumulative engine-style counters since start, vLLM names on /metrics."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted = 0
        self.active = 0
        self.max_active = 0


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _metric(
    lines: list[str],
    name: str,
    kind: str,
    help_text: str,
    samples: Iterable[tuple[Mapping[str, str], float]],
) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        rendered = ",".join(f'{k}="{_label_value(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{rendered}}} {float(value)!r}")


class FakeServer(LocalHTTPServer):
    """The HTTP server with its counters and log; `serve` runs one in the foreground."""

    daemon_threads = True

    def __init__(self, config: FakeServerConfig) -> None:
        self.config = config
        self.counters = _Counters()
        self.events = _EventLog(config.log)
        self.request_numbers = itertools.count()
        self.started_ns = time.perf_counter_ns()
        if ":" in config.host:
            self.address_family = socket.AF_INET6
        try:
            super().__init__((config.host, config.port), _Handler)
        except BaseException:
            self.events.close()
            raise


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
        model = self.config.model
        labels = {"engine": "0", "model_name": model}
        c = self.counters
        with c.lock:
            families: list[tuple[str, str, str, list[tuple[dict[str, str], float]]]] = [
                (
                    "vllm:num_requests_running",
                    "gauge",
                    "Number of requests in model execution batches.",
                    [(labels, c.active)],
                ),
                (
                    "vllm:num_requests_waiting",
                    "gauge",
                    "Number of requests waiting to be processed.",
                    [(labels, 0)],
                ),
                (
                    "vllm:prefix_cache_queries_total",
                    "counter",
                    "Prefix cache queries, in terms of number of queried tokens.",
                    [(labels, c.prompt_tokens)],
                ),
                (
                    "vllm:prefix_cache_hits_total",
                    "counter",
                    "Prefix cache hits, in terms of number of cached tokens.",
                    [(labels, 0)],
                ),
                (
                    "vllm:prompt_tokens_total",
                    "counter",
                    "Number of prefill tokens processed.",
                    [(labels, c.prompt_tokens)],
                ),
                (
                    "vllm:generation_tokens_total",
                    "counter",
                    "Number of generation tokens processed.",
                    [(labels, c.generation_tokens)],
                ),
                (
                    "vllm:request_success_total",
                    "counter",
                    "Count of successfully processed requests.",
                    [({**labels, "finished_reason": r}, c.success[r]) for r in FINISH_REASONS],
                ),
            ]
            if self.config.tokens_per_chunk > 1:
                families += [
                    (
                        "vllm:spec_decode_num_drafts_total",
                        "counter",
                        "Number of spec decoding drafts.",
                        [(labels, c.drafts)],
                    ),
                    (
                        "vllm:spec_decode_num_draft_tokens_total",
                        "counter",
                        "Number of draft tokens.",
                        [(labels, c.draft_tokens)],
                    ),
                    (
                        "vllm:spec_decode_num_accepted_tokens_total",
                        "counter",
                        "Number of accepted tokens.",
                        [(labels, c.accepted)],
                    ),
                ]
            families += [
                (
                    "tokrecord_fake_active_generations",
                    "gauge",
                    "Generations in progress now.",
                    [({"model_name": model}, c.active)],
                ),
                (
                    "tokrecord_fake_max_concurrent_generations",
                    "gauge",
                    "Most generations in progress at once since start.",
                    [({"model_name": model}, c.max_active)],
                ),
            ]
        lines: list[str] = []
        for name, kind, help_text, samples in families:
            _metric(lines, name, kind, help_text, samples)
        return "\n".join(lines) + "\n"
