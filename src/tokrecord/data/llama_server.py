"""Run xllamacpp's embedded llama.cpp HTTP server as a process with llama-server's argv.

    python llama_server.py -m MODEL.gguf --host 127.0.0.1 --port 8080 -t 1 -np 1 --metrics ...

xllamacpp has no CLI entry point and no `python -m`. Its wheel does link llama.cpp's own argument
parser (common_params_parse, exported from xllamacpp.abi3.so), so this launcher hands argv to
that parser, writing into the common_params struct held inside an xllamacpp.CommonParams object,
and then starts xllamacpp.Server with it: every llama-server flag then means exactly what it
means to llama-server (same defaults, same validation, same errors).

The struct's address inside the Python object is found, not assumed: sentinels are set through
the Python properties (n_predict, n_ctx, n_batch, the struct's first three int32 fields) and
looked up in the object's memory. The llama_example value for the server is checked too: the
parser accepts --metrics/--slots only for LLAMA_EXAMPLE_SERVER. If either check fails the
launcher stops instead of guessing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

import xllamacpp

_PARSE_SYMBOL = "_Z19common_params_parseiPPcR13common_params13llama_examplePFviS0_E"
_SENTINELS = (0x5A17_0001, 0x5A17_0002, 0x5A17_0003)
_SERVER_EXAMPLE_GUESS = 12  # LLAMA_EXAMPLE_SERVER in common/common.h (b11434); checked below


def _struct_address(params: xllamacpp.CommonParams) -> int:
    saved = (params.n_predict, params.n_ctx, params.n_batch)
    params.n_predict, params.n_ctx, params.n_batch = _SENTINELS
    try:
        base = id(params)
        words = (ctypes.c_int32 * 64).from_address(base)
        for i in range(61):
            if tuple(words[i : i + 3]) == _SENTINELS:
                return base + 4 * i
        raise RuntimeError("common_params not found inside xllamacpp.CommonParams")
    finally:
        params.n_predict, params.n_ctx, params.n_batch = saved


def _parser() -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    lib = ctypes.CDLL(xllamacpp.xllamacpp.__file__)
    fn = getattr(lib, _PARSE_SYMBOL)
    fn.restype = ctypes.c_bool
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p, ctypes.c_int,
                   ctypes.c_void_p]
    return fn


def _parse(fn: ctypes._CFuncPtr, args: list[str], example: int) -> xllamacpp.CommonParams | None:  # type: ignore[name-defined]
    params = xllamacpp.CommonParams()
    # CommonParams.__cinit__ sets port 0 (ephemeral); llama-server's default is 8080.
    params.port = 8080
    argv = ["llama-server", *args]
    arr = (ctypes.c_char_p * (len(argv) + 1))(*[a.encode() for a in argv], None)
    ok = fn(len(argv), arr, _struct_address(params), example, None)
    return params if ok else None


def _server_example(fn: ctypes._CFuncPtr) -> int:  # type: ignore[name-defined]
    # Only the server example knows --metrics and --slots; parse errors go to stderr, so mute it.
    probe = ["--metrics", "--slots"]
    devnull = os.open(os.devnull, os.O_WRONLY)
    saved = os.dup(2)
    try:
        os.dup2(devnull, 2)
        candidates = [_SERVER_EXAMPLE_GUESS, *[e for e in range(40) if e != _SERVER_EXAMPLE_GUESS]]
        for example in candidates:
            p = _parse(fn, probe, example)
            if p is not None and p.endpoint_metrics:
                return example
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
    raise RuntimeError("no llama_example accepts --metrics/--slots")


def main(args: list[str]) -> int:
    t0 = time.monotonic()
    fn = _parser()
    example = _server_example(fn)
    params = _parse(fn, args, example)
    if params is None:
        return 1  # the parser has printed the error (as llama-server does)
    sp = params.speculative
    # What the parser made of the argv, in one line: the facts a plan's log rules check.
    print(f"xllamacpp {xllamacpp.__version__} llama_example={example}; "
          f"model={params.model.path} host={params.hostnames} port={params.port} "
          f"n_parallel={params.n_parallel} threads={params.cpuparams.n_threads} "
          f"cache_prompt={params.cache_prompt} n_cache_reuse={params.n_cache_reuse} "
          f"spec_types={[t.name for t in sp.types]} draft_model={sp.draft.mparams.path!r}",
          file=sys.stderr, flush=True)
    if os.environ.get("TOKRECORD_LLAMA_PARSE_ONLY"):
        print({"n_parallel": params.n_parallel, "threads": params.cpuparams.n_threads,
               "metrics": params.endpoint_metrics, "slots": params.endpoint_slots,
               "cache_prompt": params.cache_prompt, "n_cache_reuse": params.n_cache_reuse,
               "spec_types": [t.name for t in sp.types], "draft_model": sp.draft.mparams.path,
               "draft_n_max": sp.draft.n_max, "n_ctx": params.n_ctx, "seed": params.sampling.seed},
              flush=True)
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = xllamacpp.Server(params)  # returns once the model is loaded and HTTP is listening
    print(f"listening on {server.listening_address} after {time.monotonic() - t0:.3f} s",
          file=sys.stderr, flush=True)
    stop.wait()
    # Leave without running the C++ destructors: the process is going away, and llama.cpp's
    # server threads do not all stop cleanly from a Python finaliser.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
