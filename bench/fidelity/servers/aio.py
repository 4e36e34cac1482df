"""A paced asyncio server: `python -m bench.fidelity.servers.aio --port P --log F`.

One event loop, one `asyncio.Protocol` per connection, as uvicorn runs vLLM's and
SGLang's API servers: bytes arrive in `data_received`, a task per request streams
with `asyncio.sleep` to each due time (the loop's timer, `loop.call_at`), and each
chunk is one `transport.write`, stamped just before it. The response headers go
out at once, as Starlette's StreamingResponse sends them.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from bench.fidelity.servers.common import (
    STREAM_HEADERS,
    Schedule,
    SendLog,
    add_arguments,
    chunk_line,
    done_line,
    generation,
    get_reply,
    parse_request,
    request_line,
    whole,
)


class Connection(asyncio.Protocol):
    def __init__(self, schedule: Schedule, log: SendLog) -> None:
        self.schedule = schedule
        self.log = log
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.busy: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.busy is not None:
            self.busy.cancel()

    def _next(self) -> None:
        """Start the next complete request, one at a time per connection."""
        if self.busy is not None or b"\r\n\r\n" not in self.buffer:
            return
        head, rest = self.buffer.split(b"\r\n\r\n", 1)
        method, path, headers = parse_request(head)
        length = int(headers.get("content-length", "0"))
        if len(rest) < length:
            return
        t_req = time.perf_counter_ns()
        body, self.buffer = rest[:length], rest[length:]
        close = headers.get("connection", "").lower() == "close"
        self.busy = asyncio.get_running_loop().create_task(
            self._answer(t_req, method, path, body, close))

    async def _answer(self, t_req: int, method: str, path: str, body: bytes, close: bool) -> None:
        assert self.transport is not None
        if method == "GET":
            self.transport.write(get_reply(path))
        elif path == "/v1/completions":
            await self._stream(t_req, body)
        else:
            self.transport.write(whole(404, b'{"error":"not found"}'))
        self.busy = None
        if close:
            self.transport.close()
        else:
            self._next()

    async def _stream(self, t_req: int, body: bytes) -> None:
        transport = self.transport
        assert transport is not None
        gen = generation(body, self.schedule)
        req = self.log.request()
        lines: list[dict[str, Any]] = [request_line(req, t_req, gen.max_tokens)]
        transport.write(STREAM_HEADERS)
        outcome = "complete"
        try:
            for positions in gen.plan():
                frame = gen.event(positions)
                due = self.schedule.due_ns(t_req, positions[-1])
                wait = due - time.perf_counter_ns()
                if wait > 0:
                    await asyncio.sleep(wait / 1e9)
                if transport.is_closing():
                    outcome = "disconnected"
                    break
                t = time.perf_counter_ns()
                transport.write(frame)
                lines.append(chunk_line(req, t, due, positions))
            else:
                transport.write(gen.closing())
        except asyncio.CancelledError:
            outcome = "disconnected"
        lines.append(done_line(req, outcome))
        self.log.flush(lines)


async def serve(args: argparse.Namespace) -> None:
    schedule = Schedule(args.ttft_ms, args.tok_s, args.tokens_per_chunk)
    log = SendLog(args.log)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(schedule, log), args.host, args.port,
                                      reuse_address=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    asyncio.run(serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
