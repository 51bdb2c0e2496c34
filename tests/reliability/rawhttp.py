"""A tiny keep-alive HTTP/1.1 client on asyncio streams: exact bytes out, little CPU per request.

httpx costs about as much CPU per request as the app itself, and the load test shares one
interpreter (and its GIL) with the server, so the load generator must stay cheap.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass


@dataclass
class Answer:
    status: int
    body: bytes
    seconds: float


class Connection:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=2**20)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None

    async def post(self, path: str, body: bytes, headers: dict[str, str], timeout: float = 30.0) -> Answer:
        started = time.perf_counter()
        answer = await asyncio.wait_for(self._post(path, body, headers), timeout)
        answer.seconds = time.perf_counter() - started
        return answer

    async def _post(self, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        if self.writer is None:
            await self._open()
        assert self.reader is not None and self.writer is not None
        head = f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        self.writer.write(head.encode("latin-1") + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            await self.close()
            raise ConnectionError("the server closed the connection without an answer")
        status = int(status_line.split()[1])
        length, close = 0, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        data = await self.reader.readexactly(length) if length else b""
        if close:
            await self.close()
        return Answer(status, data, 0.0)
