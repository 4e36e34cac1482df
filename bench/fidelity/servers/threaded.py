"""A paced server of threads: `python -m bench.fidelity.servers.threaded --port P --log F`.

One thread per connection (`socketserver.ThreadingTCPServer`), HTTP/1.1 parsed by
hand with keep-alive, `time.sleep` to each chunk's due time and one `sendall` per
chunk, stamped just before it. `--headers with-first` holds the response headers
back and sends them in the first chunk's write (as a server that starts its
response only when the first token exists does).
"""

from __future__ import annotations

import argparse
import socketserver
import time
from typing import Any

from bench.fidelity.servers import common


class Handler(socketserver.StreamRequestHandler):
    server: Server
    # TCP_NODELAY, as every streaming server sets it (asyncio does by default): with
    # Nagle on, a chunk sent while the previous one is unacknowledged waits for the
    # client's delayed ACK, up to 40 ms on Linux.
    disable_nagle_algorithm = True

    def handle(self) -> None:
        while True:
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = self.rfile.readline(65537)
                if not line:
                    return
                if head == b"" and line == b"\r\n":
                    continue
                head += line
            t_req = time.perf_counter_ns()
            method, path, headers = common.parse_request(head)
            body = self.rfile.read(int(headers.get("content-length", "0")))
            if method == "GET":
                self.request.sendall(common.get_reply(path))
            elif path == "/v1/completions":
                self.stream(t_req, body)
            else:
                self.request.sendall(common.whole(404, b'{"error":"not found"}'))
            if headers.get("connection", "").lower() == "close":
                return

    def stream(self, t_req: int, body: bytes) -> None:
        server = self.server
        gen = common.generation(body, server.schedule)
        req = server.log.request()
        lines: list[dict[str, Any]] = [common.request_line(req, t_req, gen.max_tokens)]
        sock = self.request
        pending = common.STREAM_HEADERS
        if not server.headers_with_first:
            sock.sendall(pending)
            pending = b""
        outcome = "complete"
        try:
            for positions in gen.plan():
                frame = pending + gen.event(positions)
                pending = b""
                due = server.schedule.due_ns(t_req, positions[-1])
                wait = due - time.perf_counter_ns()
                if wait > 0:
                    time.sleep(wait / 1e9)
                t = time.perf_counter_ns()
                sock.sendall(frame)
                lines.append(common.chunk_line(req, t, due, positions))
            sock.sendall(gen.closing())
        except OSError:
            outcome = "disconnected"
        lines.append(common.done_line(req, outcome))
        server.log.flush(lines)


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], schedule: common.Schedule, log: common.SendLog,
                 headers_with_first: bool) -> None:
        super().__init__(address, Handler)
        self.schedule = schedule
        self.log = log
        self.headers_with_first = headers_with_first


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    common.add_arguments(parser)
    parser.add_argument("--headers", choices=("early", "with-first"), default="with-first")
    args = parser.parse_args(argv)
    schedule = common.Schedule(args.ttft_ms, args.tok_s, args.tokens_per_chunk)
    with Server((args.host, args.port), schedule, common.SendLog(args.log),
                args.headers == "with-first") as server:
        server.serve_forever()


if __name__ == "__main__":
    main()
