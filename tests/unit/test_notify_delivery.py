"""Approval requests to webhooks, the sending half: retries, backoff, Retry-After, bounds, and failures told.

Each test runs a real HTTP receiver (aiohttp, on a free port of this machine) and a real Notifier on one event
loop. The Events the Notifier posts are collected where the EventRecorder would hand them to the API server;
tests/integration/test_notifications.py shows them on a real one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

from aiohttp import web
from prometheus_client import REGISTRY

from corral.devcluster.processes import free_port
from corral.kube.events import EventRecorder
from corral.notify.payloads import NotifySettings, RetrySettings, Webhook
from corral.notify.sender import Notifier

Answer = Callable[[int], Awaitable[web.StreamResponse]]  # the attempt's number (1, 2, ...) -> the answer


@dataclass
class Receiver:
    port: int
    seen: list[tuple[float, web.Request, bytes]] = field(default_factory=list)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    @property
    def gaps(self) -> list[float]:
        times = [t for t, _, _ in self.seen]
        return [b - a for a, b in pairwise(times)]


@asynccontextmanager
async def receiver(answer: Answer) -> AsyncIterator[Receiver]:
    received = Receiver(free_port())

    async def handle(request: web.Request) -> web.StreamResponse:
        received.seen.append((time.monotonic(), request, await request.read()))
        return await answer(len(received.seen))

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", received.port).start()
    try:
        yield received
    finally:
        await runner.cleanup()


def status(code: int, **headers: str) -> Answer:
    async def answer(_attempt: int) -> web.StreamResponse:
        return web.Response(status=code, text="nope" if code >= 300 else "ok", headers=headers)
    return answer


def intent(name: str = "lock-up", expires_in_s: float = 300.0) -> dict[str, Any]:
    expires = (datetime.now(UTC) + timedelta(seconds=expires_in_s)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"metadata": {"name": name, "namespace": "home", "uid": "uid-1"},
            "spec": {"device": "front-door-lock", "actuator": "locked", "action": "set_state",
                     "params": {"value": True}, "reason": "Everyone left", "requester": "alice"},
            "status": {"phase": "AwaitingApproval", "risk": "high", "approvalExpiresAt": expires}}


class Events:
    def __init__(self) -> None:
        self.posted: list[dict[str, Any]] = []
        self.recorder = EventRecorder(self._send)

    async def _send(self, namespace: str, body: dict[str, Any]) -> None:
        self.posted.append(body)


def retry(attempts: int = 4, initial: float = 0.05, max_delay: float = 1.0, timeout: float = 1.0) -> RetrySettings:
    return RetrySettings(attempts=attempts, initial_delay_seconds=initial, max_delay_seconds=max_delay,
                         timeout_seconds=timeout)


def count(name: str, webhook: str, label: str, value: str) -> float:
    return REGISTRY.get_sample_value(name, {"webhook": webhook, label: value}) or 0.0


async def until(probe: Callable[[], object], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_5xx_is_retried_with_growing_gaps_until_it_is_delivered() -> None:
    async def flaky(attempt: int) -> web.StreamResponse:
        return web.Response(status=503 if attempt < 4 else 200)

    async def scenario() -> None:
        async with receiver(flaky) as rx:
            events = Events()
            notifier = Notifier(NotifySettings((Webhook("flaky-ok", "json", rx.url("/hook")),), retry(5)),
                                "https://console.example", events.recorder)
            await notifier.start()
            try:
                notifier.waiting(intent())
                await until(lambda: count("corral_notifications_total", "flaky-ok", "outcome", "sent") == 1)
            finally:
                await notifier.stop()
            assert len(rx.seen) == 4
            gaps = rx.gaps
            assert all(b > a for a, b in pairwise(gaps)), gaps  # 0.05, 0.1, 0.2 + jitter < half
            assert count("corral_notification_attempts_total", "flaky-ok", "result", "retried") == 3
            assert count("corral_notification_attempts_total", "flaky-ok", "result", "ok") == 1
            assert count("corral_notifications_total", "flaky-ok", "outcome", "failed") == 0
            assert not events.posted

    asyncio.run(scenario())


def test_4xx_is_not_retried_and_the_failure_is_told_on_the_intent_without_the_url() -> None:
    async def scenario() -> None:
        async with receiver(status(404)) as rx:
            events = Events()
            hook = Webhook("gone", "ntfy", rx.url("/topic-s3cret"), {"Authorization": "Bearer tk_s3cret"})
            notifier = Notifier(NotifySettings((hook,), retry(5)), None, events.recorder)
            await notifier.start()
            try:
                notifier.waiting(intent())
                await until(lambda: events.posted)
            finally:
                await notifier.stop()
            assert len(rx.seen) == 1
            assert rx.seen[0][1].headers["Authorization"] == "Bearer tk_s3cret"
            (event,) = events.posted
            assert (event["reason"], event["type"], event["regarding"]["name"]) == ("NotificationFailed", "Warning",
                                                                                     "lock-up")
            assert "webhook gone (ntfy)" in event["note"] and "not retried: HTTP 404: nope" in event["note"]
            assert "s3cret" not in event["note"]
            assert count("corral_notifications_total", "gone", "outcome", "failed") == 1

    asyncio.run(scenario())


def test_an_exhausted_webhook_gives_up_after_its_attempts() -> None:
    async def scenario() -> None:
        async with receiver(status(500)) as rx:
            events = Events()
            notifier = Notifier(NotifySettings((Webhook("down", "slack", rx.url("/x")),), retry(3)), None,
                                events.recorder)
            await notifier.start()
            try:
                notifier.waiting(intent())
                await until(lambda: events.posted)
            finally:
                await notifier.stop()
            assert len(rx.seen) == 3
            assert "gave up after 3 attempts: HTTP 500" in events.posted[0]["note"]
            assert count("corral_notification_attempts_total", "down", "result", "retried") == 2
            assert count("corral_notification_attempts_total", "down", "result", "failed") == 1

    asyncio.run(scenario())


def test_retry_after_is_honoured_within_the_bound() -> None:
    async def busy(attempt: int) -> web.StreamResponse:
        return web.Response(status=429, headers={"Retry-After": "1" if attempt == 1 else "3600"}) \
            if attempt < 3 else web.Response(status=200)

    async def scenario() -> None:
        async with receiver(busy) as rx:
            notifier = Notifier(NotifySettings((Webhook("busy", "json", rx.url("/x")),), retry(4, max_delay=1.5)),
                                None, Events().recorder)
            await notifier.start()
            try:
                notifier.waiting(intent())
                await until(lambda: count("corral_notifications_total", "busy", "outcome", "sent") == 1)
            finally:
                await notifier.stop()
            first, second = rx.gaps
            assert 1.0 <= first < 1.4, first  # as asked, rather than the 0.05 s backoff
            assert 1.5 <= second < 1.9, second  # an hour asked for: the bound

    asyncio.run(scenario())


def test_no_receiver_at_all_is_a_retried_network_error() -> None:
    async def scenario() -> None:
        events = Events()
        url = f"http://127.0.0.1:{free_port()}/nobody-s3cret"
        notifier = Notifier(NotifySettings((Webhook("nobody", "json", url),), retry(2)), None, events.recorder)
        await notifier.start()
        try:
            notifier.waiting(intent())
            await until(lambda: events.posted)
        finally:
            await notifier.stop()
        note = events.posted[0]["note"]
        assert "gave up after 2 attempts: cannot connect" in note and "s3cret" not in note
        assert count("corral_notification_attempts_total", "nobody", "result", "retried") == 1

    asyncio.run(scenario())


def test_retries_stop_when_the_approval_window_closes() -> None:
    async def scenario() -> None:
        async with receiver(status(502)) as rx:
            events = Events()
            notifier = Notifier(NotifySettings((Webhook("late", "json", rx.url("/x")),),
                                               retry(5, initial=1.0, max_delay=2.0)), None, events.recorder)
            await notifier.start()
            try:
                notifier.waiting(intent(expires_in_s=0.5))
                await until(lambda: events.posted)
            finally:
                await notifier.stop()
            assert len(rx.seen) == 1
            assert "gave up after 1 attempt(s), as the approval window closes: HTTP 502" in events.posted[0]["note"]

    asyncio.run(scenario())


def test_a_hanging_webhook_never_blocks_the_caller_and_its_queue_is_bounded() -> None:
    release = asyncio.Event()

    async def hang(_attempt: int) -> web.StreamResponse:
        await release.wait()
        return web.Response(status=200)

    async def scenario() -> None:
        async with receiver(hang) as rx:
            events = Events()
            slow = Webhook("hangs", "json", rx.url("/slow"))
            notifier = Notifier(NotifySettings((slow,), retry(1, timeout=0.3)), None, events.recorder,
                                max_queued=2, concurrency=1)
            await notifier.start()
            try:
                started = time.perf_counter()
                for i in range(5):
                    notifier.waiting(intent(f"lock-{i}"))
                assert time.perf_counter() - started < 0.05  # queued, nothing awaited
                # Two fit in the queue; three are dropped, each told on its Intent.
                assert count("corral_notifications_total", "hangs", "outcome", "dropped") == 3
                assert REGISTRY.get_sample_value("corral_notifications_queued", {"webhook": "hangs"}) == 2
                await until(lambda: count("corral_notifications_total", "hangs", "outcome", "failed") == 2)
            finally:
                release.set()
                await notifier.stop()
            notes = sorted(e["note"] for e in events.posted)
            assert sum("2 approval requests are waiting for this webhook already" in n for n in notes) == 3
            assert sum("no answer within 0.3 s" in n for n in notes) == 2

    asyncio.run(scenario())


def test_an_unreadable_intent_is_logged_not_raised() -> None:
    async def scenario() -> None:
        notifier = Notifier(NotifySettings((Webhook("any", "json", "http://127.0.0.1:9/x"),)), None,
                            Events().recorder)
        notifier.waiting({"metadata": {}})  # no exception reaches the Intent reconciler

    asyncio.run(scenario())
