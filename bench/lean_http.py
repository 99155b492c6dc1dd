"""A minimal asyncio HTTP/1.1 client for bench/herd.py, stdlib only: one keep-alive connection
per client over asyncio streams, requests prepared once as bytes, answers read by Content-Length
(or chunks). About ten times cheaper per call than httpx, so one Python process can drive a crowd
of 1,000 faster than the limits it measures. Loopback benchmarks only: no TLS, no redirects, no
proxies, no compression."""

import asyncio
import json

TIMEOUT = 30.0


class HTTPError(Exception):
    """The connection failed or closed before a whole answer (the call counts as status 0).
    `connecting`: it failed before the request was sent."""

    def __init__(self, what, connecting=False):
        super().__init__(what)
        self.connecting = connecting


def prepare(method, host, port, path, headers=(), body=None):
    """The bytes of a request, ready to send again and again on a keep-alive connection.
    `headers`: a dict or (name, value) pairs; `body`: bytes as they are, else an object sent as
    JSON."""
    data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: keep-alive"]
    for k, v in (headers.items() if isinstance(headers, dict) else headers):
        lines.append(f"{k}: {v}")
    if body is not None and not isinstance(body, bytes):
        lines.append("Content-Type: application/json")
    if data or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(data)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data


class Answer:
    """`headers`: the (name, value) pairs as sent; `header(name)`: the last value of one."""

    __slots__ = ("status", "headers", "body", "_last")

    def __init__(self, status, headers, last, body):
        self.status, self.headers, self._last, self.body = status, headers, last, body

    def header(self, name, default=None):
        return self._last.get(name.lower(), default)

    def error_code(self):
        """The `error.code` (or type) of an error answer, else its status as text."""
        try:
            err = json.loads(self.body).get("error")
            return (err.get("code") or err.get("type") or str(self.status)) if err else str(self.status)
        except Exception:
            return str(self.status)


class Conn:
    """One keep-alive connection, opened on first use and again after the server closed it."""

    __slots__ = ("host", "port", "reader", "writer")

    def __init__(self, host, port):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def connect(self):
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 20)

    async def send(self, request, timeout=TIMEOUT):
        """Sends prepared bytes, returns the Answer; raises HTTPError on a failed exchange."""
        connecting = True
        try:
            async with asyncio.timeout(timeout):
                await self.connect()
                connecting = False
                self.writer.write(request)
                return await self._read()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ValueError) as e:
            self.close()
            raise HTTPError(type(e).__name__, connecting) from e

    async def _read(self):
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        pairs, headers = [], {}
        for line in lines[1:]:
            if line:
                k, _, v = line.partition(":")
                k, v = k.strip(), v.strip()
                pairs.append((k, v))
                headers[k.lower()] = v
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readuntil(b"\r\n")
                    break
                parts.append(await self.reader.readexactly(size))
                await self.reader.readexactly(2)
            body = b"".join(parts)
        else:
            body = await self.reader.read()
            self.close()
        if headers.get("connection", "").lower() == "close":
            self.close()
        return Answer(status, pairs, headers, body)

    def close(self):
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class Pool:
    """Idle keep-alive connections to one server, shared by concurrent callers."""

    def __init__(self, host, port):
        self.host, self.port = host, port
        self.idle = []

    async def warm(self, n):
        """Opens n connections now, so a crowd's first calls do not queue on the listener."""
        conns = [Conn(self.host, self.port) for _ in range(n)]
        await asyncio.gather(*(c.connect() for c in conns))
        self.idle.extend(conns)

    async def send(self, request, timeout=TIMEOUT):
        conn = self.idle.pop() if self.idle else Conn(self.host, self.port)
        answer = await conn.send(request, timeout)
        if conn.writer is not None:
            self.idle.append(conn)
        return answer

    def close(self):
        for c in self.idle:
            c.close()
        self.idle.clear()
