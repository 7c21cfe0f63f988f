"""An HTTP proxy on 127.0.0.1 that gives a local server a real bucket's latency and bandwidth.

Each request waits `latency` seconds before it is forwarded (a round trip to a far data
centre), and each connection moves its bodies, up and down, at most at `bandwidth` bytes per
second (HTTP/1.1 requests on one connection follow each other, so a request's own pace is
its connection's). It counts requests and body bytes; ``GET /__proxy_stats`` answers them
as JSON (not counted). Redirect and upload-session URLs naming the server are rewritten to
name the proxy.

Run as ``python -m bench._latency_proxy UPSTREAM PORT LATENCY_S BANDWIDTH_BYTES_PER_S``;
it prints ``ready`` once it listens.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

CHUNK = 256 << 10
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "expect",
}


class _Pace:
    """Sleeps so that `count` bytes since the start took at least count / bandwidth seconds."""

    def __init__(self, bandwidth: float) -> None:
        self.bandwidth, self.started, self.count = bandwidth, time.perf_counter(), 0

    async def moved(self, count: int) -> None:
        self.count += count
        ahead = self.count / self.bandwidth - (time.perf_counter() - self.started)
        if ahead > 0:
            await asyncio.sleep(ahead)


def main(upstream: str, port: int, latency: float, bandwidth: float) -> None:
    from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

    stats = {"requests": 0, "bytes_up": 0, "bytes_down": 0}
    proxy_url = f"http://127.0.0.1:{port}"
    log_path = os.environ.get("BENCH_PROXY_LOG")
    log = open(log_path, "a") if log_path else None  # noqa: SIM115 (open while serving)

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path == "/__proxy_stats":
            return web.json_response(stats)
        stats["requests"] += 1
        began = time.perf_counter()
        await asyncio.sleep(latency)
        pace = _Pace(bandwidth)
        body = bytearray()
        async for block in request.content.iter_chunked(CHUNK):
            body += block
            stats["bytes_up"] += len(block)
            await pace.moved(len(block))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        session: ClientSession = request.app["session"]
        async with session.request(
            request.method,
            upstream + request.rel_url.raw_path_qs,
            headers=headers,
            data=bytes(body) if body or request.method in ("POST", "PUT", "PATCH") else None,
            allow_redirects=False,
        ) as answer:
            response = web.StreamResponse(status=answer.status, reason=answer.reason)
            for name, value in answer.headers.items():
                if name.lower() not in HOP_BY_HOP:
                    response.headers.add(name, value.replace(upstream, proxy_url))
            if answer.content_length is not None:
                response.content_length = answer.content_length
            await response.prepare(request)
            if request.method != "HEAD":
                async for block in answer.content.iter_chunked(CHUNK):
                    await response.write(block)
                    stats["bytes_down"] += len(block)
                    await pace.moved(len(block))
            await response.write_eof()
            if log is not None:  # a timeline for profiling (BENCH_PROXY_LOG)
                log.write(
                    f"{began:.4f} {time.perf_counter() - began:.4f} {request.method} "
                    f"{answer.status} {len(body)} {pace.count - len(body)} "
                    f"{request.rel_url.raw_path_qs[:160]}\n"
                )
                log.flush()
            return response

    async def start(app: web.Application) -> None:
        app["session"] = ClientSession(
            connector=TCPConnector(limit=0),
            auto_decompress=False,
            timeout=ClientTimeout(total=None, sock_read=600),
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )

    async def stop(app: web.Application) -> None:
        await app["session"].close()

    app = web.Application(client_max_size=1 << 40)
    app.router.add_route("*", "/{tail:.*}", handle)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)

    async def serve() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


def stats_of(proxy_url: str) -> dict:
    """The proxy's counters so far."""
    import urllib.request

    with urllib.request.urlopen(f"{proxy_url}/__proxy_stats", timeout=10) as answer:
        return json.load(answer)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]))
