"""Approval requests to webhooks, the pure half: the `--notify-config` file's model, the message each kind of
receiver gets, and which answers deserve another attempt. No I/O here; `notify/sender.py` sends.

Three kinds of receiver: `ntfy` (the message as text, with Title, Click, Tags and Priority headers: ntfy's
publish API), `slack` (a Slack-compatible incoming webhook, `{"text": ...}` with the link as `<url|text>`) and
`json` (the facts as one JSON object, for anything else). Part of every message comes from the requester (its
username, reason and value): that text is stripped of control and format characters and bounded, and for
Slack escaped (`&`, `<`, `>`, as Slack asks) and set in code spans, so it can add no link, mention or markup.

Webhook URLs and headers are secrets (an ntfy topic, a Slack hook, a token): they are never shown, not in a
validation error nor in a repr; webhooks are named by their configured `name`.
"""

from __future__ import annotations

import json
import re
import unicodedata
from base64 import b64encode
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Annotated, Any, Final, Literal
from urllib.parse import quote, urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from corral.api.intent import Intent

Kind = Literal["ntfy", "slack", "json"]
KINDS: Final[tuple[Kind, ...]] = ("ntfy", "slack", "json")
Verdict = Literal["sent", "retry", "fail"]

MAX_WEBHOOKS: Final = 16
MAX_HEADERS: Final = 32
# Bounds of what a message carries (characters): a reason is at most 512 by the CRD already.
REQUESTER_LIMIT: Final = 128
REASON_LIMIT: Final = 512
VALUE_LIMIT: Final = 128
TITLE_LIMIT: Final = 120
TEXT_LIMIT: Final = 2000  # well within ntfy's 4096-byte message (beyond it, a message becomes an attachment)
ANSWER_LIMIT: Final = 200  # of a receiver's error answer, in a failure's reason

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$")  # an RFC 9110 token
_PRIORITY: Final = {"low": "2", "medium": "3", "high": "4", "critical": "5"}  # ntfy: 1 min .. 5 max
_TAG: Final = {"low": "information_source", "medium": "bell", "high": "warning", "critical": "rotating_light"}
_SLACK_ICON: Final = {"low": ":information_source:", "medium": ":bell:", "high": ":warning:",
                      "critical": ":rotating_light:"}


# ---- the configuration file ------------------------------------------------------------------------------


def check_url(value: str) -> str:
    """An http(s) URL with a host; the error never repeats the value (it may hold a secret)."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() or ord(c) < 32 for c in value):
        raise ValueError("must be an http:// or https:// URL with a host (the value is not shown: it may be secret)")
    return value


def _check_name(value: str) -> str:
    if not _DNS_LABEL.match(value):
        raise ValueError("must be a DNS label: 1-63 lowercase letters, digits and '-', starting and ending with a "
                         "letter or digit (it names the webhook in metrics and Events)")
    return value


def _check_headers(headers: dict[str, str]) -> dict[str, str]:
    if len(headers) > MAX_HEADERS:
        raise ValueError(f"at most {MAX_HEADERS} headers")
    for name, value in headers.items():
        check_header(name, value)
    return headers


def check_header(name: str, value: str) -> None:
    if not _HEADER_NAME.match(name):
        raise ValueError(f"header name {name!r} is not an HTTP token (letters, digits and !#$%&'*+.^_`|~-)")
    if any(ord(c) < 32 or ord(c) == 127 for c in value) or len(value) > 8192:
        raise ValueError(f"the value of header {name} holds control characters (newlines) or is over 8 KiB "
                         "(the value is not shown: it may be secret)")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


class RetrySettings(_Model):
    """Attempts per message, and the backoff between them: initialDelaySeconds * 2**n plus up to half of it at
    random, at most maxDelaySeconds; a receiver's Retry-After is honoured within the same bound."""

    attempts: int = Field(default=5, ge=1, le=10)
    initial_delay_seconds: float = Field(default=1.0, gt=0, le=60)
    max_delay_seconds: float = Field(default=15.0, gt=0, le=300)
    timeout_seconds: float = Field(default=5.0, gt=0, le=60, description="Of one attempt, connecting included.")

    @model_validator(mode="after")
    def _ordered(self) -> RetrySettings:
        if self.max_delay_seconds < self.initial_delay_seconds:
            raise ValueError("maxDelaySeconds must be at least initialDelaySeconds")
        return self


class WebhookConfig(_Model):
    """One receiver. Its URL is given inline (`url`) or read from a file (`urlFile`, e.g. a mounted Secret);
    headers likewise (`headers`, and `headersFile` with one `Name: value` per line), the file's winning."""

    name: Annotated[str, AfterValidator(_check_name)]
    kind: Kind
    url: Annotated[str, AfterValidator(check_url)] | None = None
    url_file: Annotated[str, Field(min_length=1)] | None = None
    headers: Annotated[dict[str, str], AfterValidator(_check_headers)] = Field(default_factory=dict)
    headers_file: Annotated[str, Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _one_url(self) -> WebhookConfig:
        if (self.url is None) == (self.url_file is None):
            raise ValueError("give exactly one of url and urlFile")
        return self


class NotifyConfig(_Model):
    """The file `corral run --notify-config` reads (YAML or JSON)."""

    webhooks: Annotated[list[WebhookConfig], Field(max_length=MAX_WEBHOOKS)] = Field(default_factory=list)
    retry: RetrySettings = Field(default_factory=RetrySettings)

    @model_validator(mode="after")
    def _unique_names(self) -> NotifyConfig:
        names = [w.name for w in self.webhooks]
        doubled = sorted({n for n in names if names.count(n) > 1})
        if doubled:
            raise ValueError(f"webhook names must be unique: {', '.join(doubled)} appear more than once")
        return self


_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "top": tuple(f.alias or n for n, f in NotifyConfig.model_fields.items()),
    "webhook": tuple(f.alias or n for n, f in WebhookConfig.model_fields.items()),
    "retry": tuple(f.alias or n for n, f in RetrySettings.model_fields.items()),
}


def _where(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(the file)"


def describe_errors(err: ValidationError) -> str:
    """One line per problem, naming the field (`webhooks[1].kind`) and what is allowed; never the value given
    (URLs and headers may be secret)."""
    lines = []
    for e in err.errors(include_input=False, include_url=False):
        loc = tuple(e["loc"])
        if e["type"] == "extra_forbidden":
            group = "top" if len(loc) == 1 else "retry" if loc[0] == "retry" else "webhook"
            message = f"unknown field; allowed: {', '.join(_FIELDS[group])}"
        elif e["type"] == "missing":
            message = "is required"
        else:
            message = str(e["msg"]).removeprefix("Value error, ")
        lines.append(f"{_where(loc)}: {message}")
    return "; ".join(lines)


def parse_header_lines(text: str) -> dict[str, str]:
    """A headers file: one `Name: value` per line; empty lines and lines starting with # are skipped."""
    headers: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, colon, value = line.partition(":")
        if not colon:
            raise ValueError(f"line {number} is not `Name: value`")
        try:
            check_header(name.strip(), value.strip())
        except ValueError as err:
            raise ValueError(f"line {number}: {err}") from None
        headers[name.strip()] = value.strip()
    if len(headers) > MAX_HEADERS:
        raise ValueError(f"at most {MAX_HEADERS} headers")
    return headers


@dataclass(frozen=True)
class Webhook:
    """A receiver, its secrets resolved (they stay out of the repr)."""

    name: str
    kind: Kind
    url: str = field(repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    def secrets(self) -> list[str]:
        """What must never appear in a message about this webhook: the URL, its path and query, header values."""
        parts = urlsplit(self.url)
        found = [self.url, parts.path + (f"?{parts.query}" if parts.query else ""), *self.headers.values()]
        if parts.password:
            found.append(parts.password)
        return [s for s in found if len(s) > 1]


@dataclass(frozen=True)
class NotifySettings:
    webhooks: tuple[Webhook, ...]
    retry: RetrySettings = field(default_factory=RetrySettings)


# ---- the message ---------------------------------------------------------------------------------------------


def clean(text: str, limit: int) -> str:
    """Text from the requester, safe to show: control, format (bidi overrides, zero-width) and line/paragraph
    separator characters become spaces, and beyond `limit` characters it is cut, ending in '…'."""
    cleaned = "".join(" " if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Co", "Cs") else c for c in text)
    cleaned = cleaned.strip()
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"


def intent_link(console_url: str | None, namespace: str, name: str) -> str | None:
    """The Intent's page on the approval console: {console_url}/intents/{namespace}/{name}."""
    if not console_url:
        return None
    return f"{console_url.rstrip('/')}/intents/{quote(namespace, safe='')}/{quote(name, safe='')}"


@dataclass(frozen=True)
class ApprovalRequest:
    """What a person needs to know about an Intent waiting for them, cleaned and bounded."""

    namespace: str
    name: str
    uid: str
    device: str
    actuator: str
    action: str
    value: bool | int | float | str | None
    risk: str
    requester: str
    reason: str
    expires_at: str | None
    link: str | None
    # A timed hold is part of what a person approves: how long (spec.holdFor, as written), and what is put back
    # after it (spec.then; without it, the value from before).
    hold_for: str | None = None
    then: bool | int | float | str | None = None
    has_then: bool = False

    @property
    def value_text(self) -> str:
        return clean(json.dumps(self.value, ensure_ascii=False), VALUE_LIMIT)

    @property
    def hold_text(self) -> str:
        """ for 8s, then locked = false" (with a leading space), or "" without a hold."""
        if self.hold_for is None:
            return ""
        back = (f"{self.actuator} = {clean(json.dumps(self.then, ensure_ascii=False), VALUE_LIMIT)}" if self.has_then
                else "the value from before")
        return f" for {self.hold_for}, then {back}"

    @property
    def expires(self) -> datetime | None:
        return _parse_time(self.expires_at)


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class _Asked:
    """An Intent's facts as they came, before they are cleaned and bounded."""

    namespace: object
    name: object
    uid: object
    device: object
    actuator: object
    action: object
    value: object
    risk: object
    requester: object
    reason: object
    expires: datetime | None
    hold_for: object = None
    then: object = None
    has_then: bool = False


def _asked(intent: Intent) -> _Asked:
    meta, spec, status = intent.metadata, intent.spec, intent.status
    expires = status.approval_expires_at if status is not None else None
    return _Asked(meta.namespace, meta.name, meta.uid, spec.device, spec.actuator, spec.action,
                  spec.params.value if spec.params is not None else None, status.risk if status is not None else None,
                  spec.requester, spec.reason,
                  expires if expires is None or expires.tzinfo else expires.replace(tzinfo=UTC),
                  spec.hold_for, spec.then.value if spec.then is not None else None, spec.then is not None)


def _asked_leniently(body: Mapping[str, Any]) -> _Asked:
    """A body read field by field, as it came: a message must not depend on the Intent's schema staying as it is."""
    meta, spec = body["metadata"], body["spec"]
    status = body.get("status") or {}
    then = spec.get("then")
    return _Asked(meta["namespace"], meta["name"], meta.get("uid"), spec["device"], spec["actuator"], spec["action"],
                  (spec.get("params") or {}).get("value"), status.get("risk"), spec.get("requester"),
                  spec.get("reason"), _parse_time(status.get("approvalExpiresAt")), spec.get("holdFor"),
                  then.get("value") if isinstance(then, Mapping) else None, isinstance(then, Mapping))


def approval_request(intent: Intent | Mapping[str, Any], console_url: str | None) -> ApprovalRequest:
    """From an Intent (the model the Intent controller holds; a body as the API server returned it is read
    leniently), status included."""
    asked = _asked(intent) if isinstance(intent, Intent) else _asked_leniently(intent)
    value, then = _scalar(asked.value), _scalar(asked.then)
    risk, expires = asked.risk, asked.expires
    # Names, the device, the actuator and the action are constrained by the CRD (DNS labels, identifiers); cleaned
    # and bounded all the same, so a message never depends on that schema staying as it is.
    return ApprovalRequest(
        namespace=clean(str(asked.namespace), 63), name=clean(str(asked.name), 253),
        uid=clean(str(asked.uid or ""), 64), device=clean(str(asked.device), 63),
        actuator=clean(str(asked.actuator), 32), action=clean(str(asked.action), 32), value=value,
        risk=risk if isinstance(risk, str) and risk in _PRIORITY else "unknown",
        requester=clean(str(asked.requester or ""), REQUESTER_LIMIT), reason=clean(str(asked.reason or ""), REASON_LIMIT),
        expires_at=expires.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if expires else None,
        link=intent_link(console_url, str(asked.namespace), str(asked.name)),
        hold_for=clean(asked.hold_for, 32) if isinstance(asked.hold_for, str) else None, then=then,
        has_then=asked.has_then,
    )


def _scalar(value: object) -> bool | int | float | str | None:
    """A value from the requester as a message may carry it: a string cleaned and bounded, a number or a boolean
    as it is, anything else None."""
    if isinstance(value, str):
        return clean(value, VALUE_LIMIT)
    return value if isinstance(value, bool | int | float) else None


def title(request: ApprovalRequest) -> str:
    return clean(f"Approval needed: {request.actuator} on {request.device} ({request.risk} risk)", TITLE_LIMIT)


def plain_text(request: ApprovalRequest) -> str:
    """The message as plain text (ntfy's body, and `text` of the json kind)."""
    lines = [
        f"{request.requester} asks to {request.action} {request.actuator} = {request.value_text}{request.hold_text} "
        f"on {request.device} (namespace {request.namespace}, {request.risk} risk).",
        f"Reason given: {request.reason}",
        f"Intent {request.name}" + (f", waiting until {request.expires_at}." if request.expires_at else "."),
    ]
    if request.link:
        lines.append(f"Review and decide: {request.link}")
    return _bounded("\n".join(lines), TEXT_LIMIT)


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def slack_escape(text: str) -> str:
    """Slack's own escaping: &, < and > (nothing else), so text cannot open a link, mention or command."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack_literal(text: str) -> str:
    """Requester-supplied text as a code span: mrkdwn has no escape for *, _ or ~, and a code span is where Slack
    shows text as it is. Backticks inside would end the span; they become an apostrophe."""
    return "`" + slack_escape(text.replace("`", "'")) + "`"


def slack_text(request: ApprovalRequest) -> str:
    icon = _SLACK_ICON.get(request.risk, ":bell:")
    lines = [
        f"{icon} *Approval needed* ({slack_escape(request.risk)} risk) in `{slack_escape(request.namespace)}`",
        f"{_slack_literal(request.requester)} asks to {slack_escape(request.action)} "
        f"`{slack_escape(request.actuator)}` = {_slack_literal(request.value_text)}"
        + (f" {_slack_literal(request.hold_text.strip())}" if request.hold_text else "")
        + f" on `{slack_escape(request.device)}`",
        f"Reason given: {_slack_literal(request.reason)}",
    ]
    until = f"Waiting until {request.expires_at}. " if request.expires_at else ""
    if request.link:
        # The URL's own &, < and > escaped too (Slack's rule), and | (which would end the URL) percent-encoded.
        url = slack_escape(request.link.replace("|", "%7C"))
        lines.append(f"{until}<{url}|Review and decide on {slack_escape(request.name)}>")
    else:
        lines.append(f"{until}Intent `{slack_escape(request.name)}`")
    return _bounded("\n".join(lines), TEXT_LIMIT)


def json_document(request: ApprovalRequest) -> dict[str, Any]:
    return {
        "type": "corral.dev/AwaitingApproval",
        "intent": {"namespace": request.namespace, "name": request.name, "uid": request.uid},
        "device": request.device, "action": request.action, "actuator": request.actuator, "value": request.value,
        # A hold's fields only with a hold: what is put back after holdFor (then; absent: the value from before).
        **({"holdFor": request.hold_for} if request.hold_for is not None else {}),
        **({"then": request.then} if request.has_then else {}),
        "risk": request.risk, "requester": request.requester, "reason": request.reason,
        "expiresAt": request.expires_at, "link": request.link, "title": title(request), "text": plain_text(request),
    }


def _header_value(text: str) -> str:
    """ASCII as it is; anything else as an RFC 2047 encoded word (ntfy decodes them)."""
    if text.isascii():
        return text
    return "=?UTF-8?B?" + b64encode(text.encode()).decode() + "?="


@dataclass(frozen=True)
class Message:
    body: bytes
    headers: dict[str, str]


def render(kind: Kind, request: ApprovalRequest) -> Message:
    """The HTTP body and headers a receiver of this kind gets (the webhook's own headers are added to these)."""
    if kind == "ntfy":
        headers = {"Content-Type": "text/plain; charset=utf-8", "Title": _header_value(title(request)),
                   "Priority": _PRIORITY.get(request.risk, "3"),
                   "Tags": f"{_TAG.get(request.risk, 'bell')},corral"}
        if request.link:
            headers["Click"] = request.link
        return Message(plain_text(request).encode(), headers)
    if kind == "slack":
        # No previews: the receiver must not fetch what a requester's text links to.
        document: dict[str, Any] = {"text": slack_text(request), "unfurl_links": False, "unfurl_media": False}
    else:
        document = json_document(request)
    return Message(json.dumps(document, ensure_ascii=False).encode(), {"Content-Type": "application/json"})


# ---- answers -------------------------------------------------------------------------------------------------


def verdict(status: int) -> Verdict:
    """2xx: sent. 429 and 5xx: worth another attempt. Anything else (4xx, and 3xx: redirects are not followed,
    they would carry the message elsewhere) will not change by trying again."""
    if 200 <= status < 300:
        return "sent"
    if status == 429 or 500 <= status < 600:
        return "retry"
    return "fail"


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """A Retry-After header (delta-seconds or an HTTP-date) in seconds from now; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def next_delay(backoff: float, retry_after: float | None, max_delay: float) -> float:
    """The wait before the next attempt: the backoff, or longer when the receiver asked for it, never beyond
    max_delay."""
    wait = backoff if retry_after is None else max(backoff, retry_after)
    return max(0.0, min(wait, max_delay))


def describe_answer(status: int, body: bytes, secrets: list[str]) -> str:
    """A receiver's error answer for an Event: the status and the start of its body, cleaned, secrets removed."""
    snippet = redact(clean(body.decode("utf-8", "replace"), ANSWER_LIMIT), secrets)
    return f"HTTP {status}" + (f": {snippet}" if snippet else "")


def redact(text: str, secrets: list[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "[redacted]")
    return text
