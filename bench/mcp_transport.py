"""What the MCP transport costs per call, at both ends, for each way the SDK can serve Streamable HTTP.

One gateway process (`corral mcp --transport http`) per variant, one warm client session per protocol
generation, sequential calls of cheap tools answered from the gateway's watch cache (tools/list,
iot.list_devices, iot.query with a device_id), so the figure is the transport and not Kubernetes:

- per-call wall time (the client's clock around one call),
- per-call server CPU (the gateway process's utime+stime from /proc over all the calls, divided),
- per-call client CPU (this process's CPU time over the calls: the client SDK and httpx).

Variants (the SDK's session manager options; the bench starts the gateway through itself to set them, the
product code unchanged otherwise): `sse` (the SDK's default: every handshake-era response an SSE stream, as the
gateway did before it answered handshake-era requests with JSON),
`json` (json_response=True everywhere), `stateless` (stateless_http=True: no handshake-era sessions),
`product` (whatever `corral mcp` does by default now) and `walk` (the product, but without its tool-schema
lookup: the SDK runs tools/list before each 2026-07-28 tools/call with arguments).

    .venv/bin/python bench/mcp_transport.py [--calls 300] [--variants product,sse,json,stateless]
        [--profile DIR]   # cProfile of the gateway (one file per variant) and of the client, top entries printed

Real parts: the plane's kube-apiserver and Mosquitto, one simulated light (real firmware), the controller.
Prints the figures and writes bench/results/mcp_transport-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
VARIANTS = {"sse": {}, "json": {"json_response": True}, "stateless": {"stateless_http": True}, "product": None,
            "walk": None}
TICKS = os.sysconf("SC_CLK_TCK")


def serve(variant: str, profile: str | None, argv: list[str]) -> None:
    """`corral ARGV` with the SDK's streamable_http_app given this variant's options."""
    from corral.cli.main import main
    from corral.gateway.server import GatewayServer

    options = VARIANTS[variant]
    if options is not None:
        from corral.gateway import serve as serving

        # The SDK's option alone: not the product's JSON answers in handshake-era sessions either.
        serving._json_answers_in_sessions = lambda gateway: None  # type: ignore[attr-defined]
        original = GatewayServer.streamable_http_app

        def with_options(self: Any, **kwargs: Any) -> Any:
            return original(self, **{**kwargs, **options})

        GatewayServer.streamable_http_app = with_options  # type: ignore[method-assign]
    if variant == "walk":  # the product, but the SDK finds a tool's schema by running tools/list, as before
        from corral.gateway import server as serving_mcp

        serving_mcp.declared_headers = None  # type: ignore[assignment]
    sys.argv = ["corral", *argv]
    # uvicorn raises the signal that stopped it again after shutdown: ignored, so the profile below is written.
    signal.signal(signal.SIGTERM, lambda number, frame: None)
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    try:
        main()
    except SystemExit:
        pass
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)  # type: ignore[arg-type]


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def top(path: str, lines: int = 25) -> str:
    out = io.StringIO()
    stats = pstats.Stats(path, stream=out)
    stats.sort_stats("cumulative").print_stats(lines)
    return out.getvalue()


async def measure(url: str, token: str, mode: str, pid: int, calls: int, device: str,
                  client_profile: cProfile.Profile | None) -> list[dict[str, Any]]:
    from tests.gateway_harness import http_client

    kinds = {
        "tools/list": lambda c: c.list_tools(),
        "iot.list_devices": lambda c: c.call_tool("iot.list_devices", {}),
        "iot.query": lambda c: c.call_tool("iot.query", {"device_id": device}),
    }
    rows = []
    async with http_client(url, token, mode=mode) as client:
        for kind, call in kinds.items():
            for _ in range(20):  # warm: the caller's view, its RBAC review, caches
                await call(client)
            times = []
            server0, client0 = cpu_s(pid), time.process_time()
            if client_profile is not None:
                client_profile.enable()
            for _ in range(calls):
                started = time.perf_counter()
                result = await call(client)
                times.append((time.perf_counter() - started) * 1000)
            if client_profile is not None:
                client_profile.disable()
            server_ms = (cpu_s(pid) - server0) * 1000 / calls
            client_ms = (time.process_time() - client0) * 1000 / calls
            if kind != "tools/list":
                assert not result.is_error, result
            rows.append({"mode": mode, "call": kind, "wall_p50_ms": round(statistics.median(times), 2),
                         "wall_p90_ms": round(sorted(times)[int(0.9 * (len(times) - 1))], 2),
                         "server_cpu_ms": round(server_ms, 2), "client_cpu_ms": round(client_ms, 2)})
    return rows


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":  # the gateway side, started by the benchmark
        variant, profile = sys.argv[2], os.environ.get("MCP_TRANSPORT_PROFILE") or None
        serve(variant, profile, sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--variants", default="product,sse,json,stateless")
    parser.add_argument("--modes", default="legacy,2026-07-28")
    parser.add_argument("--profile", type=Path, help="write cProfile stats of the gateway and the client here")
    parser.add_argument("--fresh-plane", action="store_true")
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}: choose from {', '.join(VARIANTS)}")

    sys.path.insert(0, str(HERE.parent))
    from common import agent_namespace, bench_plane, say, wait_registered, write_result
    from tests.controller_harness import ControllerProcess
    from tests.fleet_harness import running_fleet
    from tests.gateway_harness import HttpGateway

    rows: list[dict[str, Any]] = []
    with bench_plane(fresh=args.fresh_plane) as plane, agent_namespace(plane) as (admin, namespace, token):
        prefix = f"bench-{uuid.uuid4().hex[:6]}"
        with tempfile.TemporaryDirectory() as logs, running_fleet(plane, prefix, {"lamp": "light"},
                                                                  enroll_in=(admin, namespace)):
            controller = ControllerProcess(plane, namespace, prefix, Path(logs) / "controller.log")
            controller.start()
            try:
                wait_registered(admin, namespace, 1)
                for variant in variants:
                    env_profile = str(args.profile / f"gateway-{variant}.prof") if args.profile else ""
                    os.environ["MCP_TRANSPORT_PROFILE"] = env_profile
                    if args.profile:
                        args.profile.mkdir(parents=True, exist_ok=True)
                    gateway = HttpGateway(plane, namespace, Path(logs) / f"gateway-{variant}.log",
                                          command=[sys.executable, str(HERE), "--serve", variant])
                    client_profile = cProfile.Profile() if args.profile else None
                    try:
                        for mode in args.modes.split(","):
                            for row in asyncio.run(measure(gateway.url, token, mode, gateway.proc.pid, args.calls,
                                                           f"{namespace}/lamp", client_profile)):
                                row["variant"] = variant
                                rows.append(row)
                                say(f"  {row}")
                    finally:
                        gateway.stop()
                    if client_profile is not None:
                        client_profile.dump_stats(str(args.profile / f"client-{variant}.prof"))
            finally:
                controller.stop()
    print(f"per call, {args.calls} sequential calls each, one warm session per protocol generation")
    print(f"{'variant':10} {'protocol':11} {'call':17} {'wall p50':>9} {'wall p90':>9} {'server CPU':>11} "
          f"{'client CPU':>11}  (ms)")
    for r in rows:
        print(f"{r['variant']:10} {r['mode']:11} {r['call']:17} {r['wall_p50_ms']:9.2f} {r['wall_p90_ms']:9.2f} "
              f"{r['server_cpu_ms']:11.2f} {r['client_cpu_ms']:11.2f}")
    write_result("mcp_transport", {"calls": args.calls, "rows": rows})
    if args.profile:
        for path in sorted(args.profile.glob("*.prof")):
            print(f"\n== {path.name}\n{top(str(path))}")


if __name__ == "__main__":
    main()
