"""Approval requests to webhooks, the I/O half: reading `--notify-config`, and sending with retries.

When an Intent is first written `AwaitingApproval`, the Intent controller calls `Notifier.waiting(intent)`,
which builds one message per webhook (`notify_payloads`) and queues it; it never waits and never raises, so
no webhook can delay or break a decision. Each webhook has a queue of its own (bounded: a dead receiver
cannot pile up work; beyond the bound a message is dropped, on record) and a few workers that POST with
aiohttp. A network error, a timeout, 429 or 5xx is tried again with exponential backoff and jitter
(tenacity), honouring Retry-After within the configured bound, for a bounded number of attempts and never
past the approval window; any other answer is final. A message that is not delivered is counted
(`corral_notifications_total{outcome="failed"}`) and told on the Intent as a Warning Event
`NotificationFailed` naming the webhook and why, never its URL or headers (secrets).

Delivery is best effort and at most once per Intent per controller: an Intent already waiting when the
controller starts is not announced again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import aiohttp
import yaml
from pydantic import ValidationError
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_any,
    wait_exponential_jitter,
)
from tenacity.stop import stop_base

from corral.api.codes import API_VERSION
from corral.api.intent import Intent
from corral.kube.events import EventRecorder, ObjectRef
from corral.kube.typed import Body
from corral.notify.payloads import (
    ApprovalRequest,
    Message,
    NotifyConfig,
    NotifySettings,
    Webhook,
    approval_request,
    check_url,
    describe_answer,
    describe_errors,
    next_delay,
    parse_header_lines,
    redact,
    render,
    retry_after_seconds,
    verdict,
)
from corral.obs import metrics

log = logging.getLogger(__name__)

MAX_QUEUED: Final = 100  # messages waiting per webhook
CONCURRENCY: Final = 4  # messages in flight per webhook
ANSWER_PEEK: Final = 512  # bytes of an error answer read, for its reason
USER_AGENT: Final = "corral-controller (approval requests)"


# ---- configuration -------------------------------------------------------------------------------------------


def load_config(path: str | Path) -> NotifySettings:
    """Read and check the file and the secret files it names; ValueError says which field is wrong and why."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ValueError(f"{path}: cannot be read: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: is not YAML or JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must be a mapping with `webhooks` (a list) and optionally `retry`")
    try:
        config = NotifyConfig.model_validate(data)
    except ValidationError as err:
        raise ValueError(f"{path}: {describe_errors(err)}") from None
    webhooks = []
    for index, hook in enumerate(config.webhooks):
        where = f"{path}: webhooks[{index}] ({hook.name})"
        url = hook.url
        if hook.url_file is not None:
            url = _read_secret(hook.url_file, f"{where}.urlFile").strip()
            try:
                check_url(url)
            except ValueError as err:
                raise ValueError(f"{where}.urlFile {hook.url_file}: {err}") from None
        headers = dict(hook.headers)
        if hook.headers_file is not None:
            try:
                headers.update(parse_header_lines(_read_secret(hook.headers_file, f"{where}.headersFile")))
            except ValueError as err:
                raise ValueError(f"{where}.headersFile {hook.headers_file}: {err}") from None
        assert url is not None
        webhooks.append(Webhook(hook.name, hook.kind, url, headers))
    return NotifySettings(tuple(webhooks), config.retry)


def _read_secret(file: str, where: str) -> str:
    try:
        return Path(file).read_text()
    except OSError as err:
        raise ValueError(f"{where} {file}: cannot be read: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{where} {file}: is not UTF-8 text") from None


# ---- sending -------------------------------------------------------------------------------------------------


class NotDelivered(Exception):
    """One attempt failed: why (no secrets in it), whether another attempt may help, and when the receiver asked
    to be tried again."""

    def __init__(self, reason: str, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable
        self.retry_after = retry_after


class _PastWindow(stop_base):
    """Stop when the next attempt would come after the approval window closed (wall clock, as the window)."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.deadline is not None and time.time() + retry_state.upcoming_sleep >= self.deadline


@dataclass(frozen=True)
class _Job:
    request: ApprovalRequest
    message: Message


@dataclass
class _Channel:
    webhook: Webhook
    queue: asyncio.Queue[_Job]


class Notifier:
    """Sends approval requests to the configured webhooks, off the decision path."""

    def __init__(self, settings: NotifySettings, console_url: str | None, recorder: EventRecorder,
                 max_queued: int = MAX_QUEUED, concurrency: int = CONCURRENCY) -> None:
        self.settings = settings
        self.console_url = console_url
        self.recorder = recorder
        self.concurrency = concurrency
        self._channels = [_Channel(w, asyncio.Queue(max_queued)) for w in settings.webhooks]
        self._session: aiohttp.ClientSession | None = None
        self._workers: list[asyncio.Task[None]] = []
        for webhook in settings.webhooks:  # every series from the start, at 0
            for outcome in ("sent", "failed", "dropped"):
                metrics.NOTIFICATIONS.labels(webhook=webhook.name, outcome=outcome)
            for result in ("ok", "retried", "failed"):
                metrics.NOTIFICATION_ATTEMPTS.labels(webhook=webhook.name, result=result)
            metrics.NOTIFICATIONS_QUEUED.labels(webhook=webhook.name).set(0)

    def waiting(self, intent: Intent | Body) -> None:
        """An Intent started waiting for a person: queue its request for every webhook. Returns at once and
        never raises (call on the event loop). The model, or the body as the API server returned it."""
        try:
            request = approval_request(intent, self.console_url)
        except Exception as err:  # noqa: BLE001 - an Intent that cannot be read must not stop the decision
            log.warning("no approval request sent for an Intent that could not be read: %r", err)
            return
        for channel in self._channels:
            webhook = channel.webhook
            try:
                job = _Job(request, render(webhook.kind, request))
            except Exception:  # a message that cannot be built must not stop the decision
                log.exception("could not build the approval request of Intent %s/%s for webhook %s",
                              request.namespace, request.name, webhook.name)
                continue
            if channel.queue.full():
                metrics.NOTIFICATIONS.labels(webhook=webhook.name, outcome="dropped").inc()
                log.warning("webhook %s: %d approval requests wait already; dropped the one of Intent %s/%s",
                            webhook.name, channel.queue.qsize(), request.namespace, request.name)
                self._failed(webhook, request, f"not sent: {channel.queue.qsize()} approval requests are waiting "
                                               "for this webhook already (it is slow or down)")
                continue
            channel.queue.put_nowait(job)
            metrics.NOTIFICATIONS_QUEUED.labels(webhook=webhook.name).set(channel.queue.qsize())

    async def start(self) -> None:
        if self._session is not None:
            return
        # trust_env: an egress proxy from HTTPS_PROXY/NO_PROXY, as in many clusters.
        self._session = aiohttp.ClientSession(headers={"User-Agent": USER_AGENT}, trust_env=True)
        self._workers = [
            asyncio.create_task(self._work(channel), name=f"corral-notify-{channel.webhook.name}-{i}")
            for channel in self._channels for i in range(self.concurrency)
        ]
        if self._channels:
            log.info("approval requests go to %d webhook(s): %s", len(self._channels),
                     ", ".join(f"{c.webhook.name} ({c.webhook.kind})" for c in self._channels))

    async def stop(self) -> None:
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
        unsent = sum(c.queue.qsize() for c in self._channels)
        if unsent:
            log.warning("%d approval request(s) were not sent before exit", unsent)
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _work(self, channel: _Channel) -> None:
        while True:
            job = await channel.queue.get()
            metrics.NOTIFICATIONS_QUEUED.labels(webhook=channel.webhook.name).set(channel.queue.qsize())
            try:
                await self.deliver(channel.webhook, job.request, job.message)
            except asyncio.CancelledError:
                raise
            except Exception:  # one message's bug must not end the webhook's worker
                log.exception("webhook %s: sending the approval request of %s/%s failed", channel.webhook.name,
                              job.request.namespace, job.request.name)
            finally:
                channel.queue.task_done()

    async def deliver(self, webhook: Webhook, request: ApprovalRequest, message: Message) -> bool:
        """POST the message until it is delivered, fails for good, runs out of attempts or outlives the approval
        window. True when delivered; otherwise the failure is counted and posted on the Intent."""
        retry = self.settings.retry
        attempts = 0
        backoff = wait_exponential_jitter(initial=retry.initial_delay_seconds, max=retry.max_delay_seconds,
                                          jitter=retry.initial_delay_seconds / 2)
        expires = request.expires
        deadline = expires.timestamp() if expires is not None else None

        def wait(state: RetryCallState) -> float:
            failure = state.outcome.exception() if state.outcome is not None else None
            retry_after = failure.retry_after if isinstance(failure, NotDelivered) else None
            return next_delay(backoff(state), retry_after, retry.max_delay_seconds)

        def retrying(state: RetryCallState) -> None:
            metrics.NOTIFICATION_ATTEMPTS.labels(webhook=webhook.name, result="retried").inc()
            failure = state.outcome.exception() if state.outcome is not None else None
            log.info("webhook %s: attempt %d for Intent %s/%s failed (%s); trying again in %.1f s", webhook.name,
                     state.attempt_number, request.namespace, request.name, failure, state.upcoming_sleep)

        async def attempt() -> None:
            nonlocal attempts
            attempts += 1
            await self._post(webhook, message)

        try:
            async for trying in AsyncRetrying(
                stop=stop_any(stop_after_attempt(retry.attempts), _PastWindow(deadline)),
                wait=wait,
                retry=retry_if_exception(lambda e: isinstance(e, NotDelivered) and e.retryable),
                before_sleep=retrying,
                reraise=True,
            ):
                with trying:
                    await attempt()
        except NotDelivered as failure:
            metrics.NOTIFICATION_ATTEMPTS.labels(webhook=webhook.name, result="failed").inc()
            metrics.NOTIFICATIONS.labels(webhook=webhook.name, outcome="failed").inc()
            if not failure.retryable:
                why = f"not retried: {failure.reason}"
            elif attempts >= retry.attempts:
                why = f"gave up after {attempts} attempt{'s' if attempts > 1 else ''}: {failure.reason}"
            else:
                why = f"gave up after {attempts} attempt(s), as the approval window closes: {failure.reason}"
            log.warning("webhook %s: the approval request of Intent %s/%s was not delivered, %s", webhook.name,
                        request.namespace, request.name, why)
            self._failed(webhook, request, why)
            return False
        metrics.NOTIFICATION_ATTEMPTS.labels(webhook=webhook.name, result="ok").inc()
        metrics.NOTIFICATIONS.labels(webhook=webhook.name, outcome="sent").inc()
        log.info("webhook %s: sent the approval request of Intent %s/%s (attempt %d)", webhook.name,
                 request.namespace, request.name, attempts)
        return True

    async def _post(self, webhook: Webhook, message: Message) -> None:
        """One attempt; NotDelivered unless the receiver answered 2xx."""
        if self._session is None:
            raise RuntimeError("Notifier.start() was not called")
        timeout_s = self.settings.retry.timeout_seconds
        try:
            async with self._session.post(webhook.url, data=message.body, headers={**message.headers, **webhook.headers},
                                          timeout=aiohttp.ClientTimeout(total=timeout_s),
                                          allow_redirects=False) as response:
                status = response.status
                if verdict(status) == "sent":
                    return
                answer = await response.content.read(ANSWER_PEEK)
                retry_after = retry_after_seconds(response.headers.get("Retry-After"), datetime.now(UTC))
        except TimeoutError:
            raise NotDelivered(f"no answer within {timeout_s:g} s", retryable=True) from None
        except aiohttp.ClientSSLError as err:
            # An untrusted or wrong certificate does not mend itself between attempts.
            raise NotDelivered(f"TLS failed: {type(err).__name__}", retryable=False) from None
        except aiohttp.ClientConnectorError as err:
            os_error = getattr(err, "os_error", None)
            why = getattr(os_error, "strerror", None) or type(os_error).__name__
            raise NotDelivered(redact(f"cannot connect: {why}", webhook.secrets()), retryable=True) from None
        except aiohttp.ServerDisconnectedError:
            raise NotDelivered("the receiver closed the connection without an answer", retryable=True) from None
        except aiohttp.InvalidURL:
            raise NotDelivered("the URL is not valid", retryable=False) from None
        except aiohttp.ClientError as err:
            # The exception's text can name the URL; its type says enough.
            raise NotDelivered(f"{type(err).__name__}", retryable=True) from None
        except OSError as err:
            raise NotDelivered(f"network error: {err.strerror or type(err).__name__}", retryable=True) from None
        reason = describe_answer(status, answer, webhook.secrets())
        raise NotDelivered(reason, retryable=verdict(status) == "retry", retry_after=retry_after)

    def _failed(self, webhook: Webhook, request: ApprovalRequest, why: str) -> None:
        self.recorder.post(
            ObjectRef(API_VERSION, "Intent", request.name, request.namespace, request.uid or None),
            "NotificationFailed", "Notify",
            f"The approval request to webhook {webhook.name} ({webhook.kind}) was not delivered: {why}", "Warning")
