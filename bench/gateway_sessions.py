"""Memory per MCP session at the HTTP gateway, and what its per-caller limit costs a caller at it.

Real parts only: the local kube-apiserver and `corral mcp --transport http`. One agent identity opens N
handshake-era sessions (initialize, then notifications/initialized, as a client does), then a GET stream on
each; the gateway's resident memory (VmRSS of its process) is read before, after the sessions and after
the streams. Finally the same caller asks for one session more than its limit, and the time of that 429 is
measured.

    .venv/bin/python bench/gateway_sessions.py [--sessions 1000]

Prints the figures and writes bench/results/gateway_sessions-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx

from common import agent_namespace, bench_plane, say, write_result
from tests.gateway_harness import HttpGateway

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


async def settle(pid: int) -> int:
    """RSS once it stops moving (the gateway finishes what the last requests started)."""
    last = rss_kib(pid)
    for _ in range(20):
        await asyncio.sleep(0.25)
        now = rss_kib(pid)
        if abs(now - last) < 64:
            return now
        last = now
    return last


async def measure(url: str, token: str, pid: int, sessions: int) -> dict[str, Any]:
    auth = {**HEADERS, "Authorization": f"Bearer {token}"}
    gate = asyncio.Semaphore(16)
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=sessions + 32)) as http:
        # One session first: the caller's token review and the SDK's first-use costs are not a session's.
        warm = await http.post(url, json=INITIALIZE, headers=auth)
        await http.delete(url, headers={**auth, "Mcp-Session-Id": warm.headers["mcp-session-id"]})
        before = await settle(pid)

        async def open_one() -> str:
            async with gate:
                answer = await http.post(url, json=INITIALIZE, headers=auth)
                assert answer.status_code == 200, answer.text[:200]
                session = answer.headers["mcp-session-id"]
                await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                                headers={**auth, "Mcp-Session-Id": session})
                return session

        started = time.perf_counter()
        ids = list(await asyncio.gather(*(open_one() for _ in range(sessions))))
        open_s = time.perf_counter() - started
        with_sessions = await settle(pid)

        streams: list[Any] = []
        get = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
        for session in ids:
            request = http.build_request("GET", url, headers={**get, "Mcp-Session-Id": session})
            streams.append(await http.send(request, stream=True))
        with_streams = await settle(pid)

        refused_ms = []
        for _ in range(20):
            started = time.perf_counter()
            over = await http.post(url, json=INITIALIZE, headers=auth)
            refused_ms.append((time.perf_counter() - started) * 1000)
            assert over.status_code == 429, over.status_code
        for stream in streams:
            await stream.aclose()
        for session in ids:
            await http.delete(url, headers={**auth, "Mcp-Session-Id": session})
    return {"sessions": sessions, "rss_before_kib": before, "rss_sessions_kib": with_sessions,
            "rss_streams_kib": with_streams, "open_s": round(open_s, 2),
            "kib_per_session": round((with_sessions - before) / sessions, 1),
            "kib_per_session_with_get_stream": round((with_streams - before) / sessions, 1),
            "refusal_at_limit_median_ms": round(statistics.median(refused_ms), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=1000)
    args = parser.parse_args()
    with bench_plane() as plane, agent_namespace(plane) as (_, namespace, token), \
            tempfile.TemporaryDirectory() as logs:
        gateway = HttpGateway(plane, namespace, Path(logs) / "gateway.log", "--max-sessions-per-caller",
                              str(args.sessions), "--max-streams-per-caller", str(args.sessions + 16))
        try:
            result = asyncio.run(measure(gateway.url, token, gateway.proc.pid, args.sessions))
        finally:
            gateway.stop()
    say(f"  {result}")
    print(f"{args.sessions} MCP sessions of one caller: {result['kib_per_session']} KiB each "
          f"({result['kib_per_session_with_get_stream']} KiB with a GET stream open on each); gateway RSS "
          f"{result['rss_before_kib'] // 1024} -> {result['rss_sessions_kib'] // 1024} -> "
          f"{result['rss_streams_kib'] // 1024} MiB; opened in {result['open_s']} s; one more at the limit "
          f"refused (429) in {result['refusal_at_limit_median_ms']} ms (median)")
    write_result("gateway_sessions", {"sessions": args.sessions, **result})


if __name__ == "__main__":
    main()
