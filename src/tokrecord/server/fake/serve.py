"""Serving from the command line: `python -m tokrecord.server.fake`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

from tokrecord.errors import ConfigError
from tokrecord.server.fake.config import FakeServerConfig, config_from_args
from tokrecord.server.fake.constants import CHILD_CODE
from tokrecord.server.fake.state import FakeServer


def _spawn_child() -> subprocess.Popen[bytes]:
    # Same process group on purpose: only a group-wide kill reaches it.
    return subprocess.Popen([sys.executable, "-c", CHILD_CODE])


def _exit_later(seconds: float) -> None:
    def _exit() -> None:
        sys.stderr.write(
            f"tokrecord fake server: exiting with code 3 after {seconds} s (--exit-after-s)\n"
        )
        sys.stderr.flush()
        os._exit(3)

    timer = threading.Timer(seconds, _exit)
    timer.daemon = True
    timer.start()


def serve(
    config: FakeServerConfig, on_listening: Callable[[FakeServer], None] | None = None
) -> None:
    """Run the server in the foreground until interrupted (or --exit-after-s).

    Signal options need the main thread. `on_listening` is called once bound; by
    default it prints the listening line that callers wait for.
    """
    if config.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with FakeServer(config) as server:
        if config.spawn_child:
            _spawn_child()
        if config.exit_after_s is not None:
            _exit_later(config.exit_after_s)
        if on_listening is None:
            jitter = (f" (speed factor {config.speed_factor:.6f} from leg jitter "
                      f"{config.leg_jitter_pct:g} %)" if config.leg_jitter_pct else "")
            if config.dialect == "vllm":
                print(vllm_config_line(config), file=sys.stderr, flush=True)
            print(f"tokrecord fake server listening on {server.url}{jitter}", flush=True)
        else:
            on_listening(server)
        server.serve_forever()


def vllm_config_line(config: FakeServerConfig) -> str:
    """vLLM's start-up engine-config line, in its format (graph compilation as the CPU
    engine reports it: no mode, no CUDA graphs), so that log facts read it as they would."""
    spec = "None"
    if config.speculative_config:
        try:
            given = json.loads(config.speculative_config)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"error: --speculative-config is not JSON: {exc}") from exc
        spec = (f"SpeculativeConfig(method={given.get('method')!r}, "
                f"model={given.get('model')!r}, "
                f"num_spec_tokens={given.get('num_speculative_tokens')!r})")
    return ("INFO [core.py] Initializing a V1 LLM engine (tokrecord fake) with config: "
            f"model={config.model!r}, speculative_config={spec}, compilation_config={{'mode': "
            "<CompilationMode.NONE: 0>, 'cudagraph_mode': <CUDAGraphMode.NONE: 0>, "
            "'cudagraph_capture_sizes': [], 'max_cudagraph_capture_size': 0}")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = config_from_args(argv, os.environ)
        serve(config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # e.g. the port is taken
        print(f"error: fake server cannot serve: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
