"""A loopback server for bench/hostile: ready like vLLM, hostile once a row is asked.

Modes (the completion request's answer): `forever` streams token events without end,
`line` sends one 100 MB SSE line, `no-headers` reads the request and never answers.
Every GET (readiness, /v1/models, /metrics) answers at once, so the leg gets as far as
its first row. Binds loopback only: it is an attacker, never a service.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LINE_BYTES = 100 * 1024 * 1024
MODEL = "hostile"


def _event(i: int) -> bytes:
    chunk = {"id": "c", "object": "text_completion", "model": MODEL,
             "choices": [{"index": 0, "text": f" t{i}", "token_ids": [i % 1000],
                          "finish_reason": None}]}
    payload = b"data: " + json.dumps(chunk).encode() + b"\n\n"
    return b"%x\r\n%b\r\n" % (len(payload), payload)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "forever"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}
                          ).encode()
        ctype = "text/plain" if self.path.startswith("/metrics") else "application/json"
        if self.path.startswith("/metrics"):
            body = b"# nothing\n"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            if self.mode == "no-headers":
                threading.Event().wait(3600)
                return
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n" + _event(0))
            self.wfile.flush()
            if self.mode == "forever":
                i = 1
                while True:
                    self.wfile.write(_event(i))
                    i += 1
            piece = b"x" * 65536
            self.wfile.write(b"%x\r\ndata: " % (LINE_BYTES + 6))
            for _ in range(LINE_BYTES // len(piece)):
                self.wfile.write(piece)
            self.wfile.write(b"\n\n\r\n0\r\n\r\n")
        except OSError:
            pass  # the client gave up on the row: what the bench wants to see
        self.close_connection = True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile.server")
    parser.add_argument("--mode", choices=("forever", "line", "no-headers"), required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default=MODEL)
    args = parser.parse_args(argv)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        parser.error("loopback only")
    _Handler.mode = args.mode
    server = ThreadingHTTPServer((args.host, args.port), _Handler)
    server.daemon_threads = True
    server.address_family = socket.AF_INET
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
