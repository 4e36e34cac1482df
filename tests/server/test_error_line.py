"""The one line of a server log that says why it failed."""

from __future__ import annotations

from tokrecord.engines import ENGINES, EngineName
from tokrecord.server.process import error_line

LLAMA_LOG = """\
xllamacpp 2026.10.11549 llama_example=12; model=/x/m.gguf host=127.0.0.1 port=8080
build: 0 (unknown) with cc for x86_64-linux-gnu
system info: n_threads = 1 / 2 | CPU : SSE3 = 1 | AVX = 1 |
main: binding port with default address family
main: HTTP server is listening, hostname: 127.0.0.1, port: 8080, http threads: 1
main: loading model
srv    load_model: loading model '/x/m.gguf'
gguf_init_from_file: failed to open GGUF file '/x/m.gguf' (No such file or directory)
llama_model_load: error loading model: llama_model_loader: failed to load model from /x/m.gguf
llama_model_load_from_file_impl: failed to load model
common_init_from_params: failed to load model '/x/m.gguf'
srv    load_model: failed to load model, '/x/m.gguf'
srv   operator(): operator(): cleaning up before exit...
main: exiting due to model loading error
"""

TRACEBACK = """\
INFO starting
Traceback (most recent call last):
  File "x.py", line 3, in <module>
    raise ValueError("invalid max_model_len 99999 > 2048")
ValueError: invalid max_model_len 99999 > 2048
"""


def test_llama_cpp_log_gives_the_first_error_line() -> None:
    assert error_line(LLAMA_LOG) == (
        "gguf_init_from_file: failed to open GGUF file '/x/m.gguf' (No such file or directory)")


def test_a_traceback_gives_its_exception() -> None:
    assert error_line(TRACEBACK) == "ValueError: invalid max_model_len 99999 > 2048"


def test_no_error_line() -> None:
    assert error_line("starting\nlistening\n") is None


# xllamacpp's form: llama.cpp marks its errors with E, and the launcher's traceback (a
# generic "check the input params") comes last.
XLLAMACPP_LOG = """\
0.00.003.662 I srv          init: loading model
0.00.003.777 I srv    load_model: loading model '/tmp/p35/empty.gguf'
0.00.003.896 E gguf_init_from_reader: failed to read magic
0.00.004.024 E llama_model_load: error loading model: llama_model_loader: failed to load model
0.00.004.263 I srv    operator(): operator(): cleaning up before exit...
Traceback (most recent call last):
  File "llama_server.py", line 110, in main
RuntimeError: Failed to init server, please check the input params.
"""


def test_the_engines_own_error_mark_wins() -> None:
    marked = ENGINES[EngineName.LLAMA_CPP].error_line
    assert error_line(XLLAMACPP_LOG, marked) == (
        "0.00.003.896 E gguf_init_from_reader: failed to read magic")
    assert error_line(XLLAMACPP_LOG) == (
        "RuntimeError: Failed to init server, please check the input params.")
    # A parse error comes before llama.cpp's logging starts: the generic reading finds it.
    parse = 'error while handling argument "--spec-type": unknown speculative type: x\n'
    assert error_line(parse, marked) == parse.strip()
