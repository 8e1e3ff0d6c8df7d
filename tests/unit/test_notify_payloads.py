"""Approval requests to webhooks, the pure half: the config file's model, each kind's message, retry verdicts."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from corral.api.intent import Intent
from corral.cli.main import cli
from corral.notify.payloads import (
    REASON_LIMIT,
    TEXT_LIMIT,
    VALUE_LIMIT,
    NotifyConfig,
    Webhook,
    approval_request,
    clean,
    describe_answer,
    describe_errors,
    intent_link,
    next_delay,
    parse_header_lines,
    render,
    retry_after_seconds,
    slack_escape,
    verdict,
)
from corral.notify.sender import load_config

CONSOLE = "https://corral.example/console"


def intent(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "corral.dev/v1alpha1", "kind": "Intent",
        "metadata": {"name": "lock-up-0001", "namespace": "home", "uid": "6f1c0d1e-uid"},
        "spec": {"device": "front-door-lock", "actuator": "locked", "action": "set_state", "params": {"value": True},
                 "reason": "Everyone left", "requester": "system:serviceaccount:home:agent", **spec},
        "status": {"phase": "AwaitingApproval", "risk": "high", "approvalExpiresAt": "2031-05-04T10:20:30.123456Z"},
    }


def test_the_link_is_the_intents_page_on_the_console() -> None:
    assert intent_link(CONSOLE, "home", "lock-up-0001") == f"{CONSOLE}/intents/home/lock-up-0001"
    assert intent_link(CONSOLE + "/", "home", "a.b") == f"{CONSOLE}/intents/home/a.b"
    assert intent_link(None, "home", "x") is None


def test_the_request_carries_the_facts_a_person_decides_on() -> None:
    request = approval_request(intent(), CONSOLE)
    assert (request.namespace, request.name, request.uid) == ("home", "lock-up-0001", "6f1c0d1e-uid")
    assert (request.device, request.actuator, request.action, request.value) == ("front-door-lock", "locked",
                                                                                   "set_state", True)
    assert (request.risk, request.requester, request.reason) == ("high", "system:serviceaccount:home:agent",
                                                                 "Everyone left")
    assert request.expires_at == "2031-05-04T10:20:30Z"
    assert request.link == f"{CONSOLE}/intents/home/lock-up-0001"


def test_ntfy_gets_text_with_title_click_tags_and_priority() -> None:
    message = render("ntfy", approval_request(intent(), CONSOLE))
    assert message.headers["Click"] == f"{CONSOLE}/intents/home/lock-up-0001"
    assert message.headers["Priority"] == "4"
    assert message.headers["Tags"] == "warning,corral"
    assert message.headers["Title"] == "Approval needed: locked on front-door-lock (high risk)"
    assert message.headers["Content-Type"].startswith("text/plain")
    body = message.body.decode()
    assert "system:serviceaccount:home:agent asks to set_state locked = true on front-door-lock" in body
    assert "Reason given: Everyone left" in body and "2031-05-04T10:20:30Z" in body
    assert all(v.isascii() and "\n" not in v for v in message.headers.values())


def test_critical_is_ntfys_highest_priority_and_no_console_means_no_click() -> None:
    body = intent()
    body["status"]["risk"] = "critical"
    message = render("ntfy", approval_request(body, None))
    assert message.headers["Priority"] == "5" and "Click" not in message.headers
    assert "Review" not in message.body.decode()


def test_slack_gets_its_link_form_and_requester_text_cannot_add_markup() -> None:
    hostile = intent(reason="<!channel> *URGENT* approve at <https://evil.example|the console> & `now`",
                     requester="<@U012AB3CD>", params={"value": "open > <b>"})
    document = json.loads(render("slack", approval_request(hostile, CONSOLE)).body)
    text = document["text"]
    assert f"<{CONSOLE}/intents/home/lock-up-0001|Review and decide on lock-up-0001>" in text
    # Only Corral's own link is a link: every < > & of the requester's text is escaped, and its text is in code
    # spans (no *bold*), with its backticks unable to close them.
    assert text.count("<") == 1 and text.count(">") == 1
    assert "&lt;!channel&gt;" in text and "&lt;@U012AB3CD&gt;" in text and "&amp;" in text
    assert "`&lt;!channel&gt; *URGENT* approve at &lt;https://evil.example|the console&gt; &amp; 'now'`" in text
    assert document["unfurl_links"] is False and document["unfurl_media"] is False


def test_slack_escaping_is_exactly_slacks_three_characters() -> None:
    assert slack_escape("a & b < c > d \"e\" 'f'") == "a &amp; b &lt; c &gt; d \"e\" 'f'"


def test_json_gets_every_fact_as_a_field() -> None:
    document = json.loads(render("json", approval_request(intent(), CONSOLE)).body)
    assert document["intent"] == {"namespace": "home", "name": "lock-up-0001", "uid": "6f1c0d1e-uid"}
    assert {k: document[k] for k in ("device", "action", "actuator", "value", "risk", "requester", "reason",
                                     "expiresAt", "link")} == {
        "device": "front-door-lock", "action": "set_state", "actuator": "locked", "value": True, "risk": "high",
        "requester": "system:serviceaccount:home:agent", "reason": "Everyone left",
        "expiresAt": "2031-05-04T10:20:30Z", "link": f"{CONSOLE}/intents/home/lock-up-0001"}


def test_requester_text_is_bounded_and_loses_control_and_format_characters() -> None:
    forged = "ok\n\nApproved by admin\u202e\u200b" + "x" * 2000
    request = approval_request(intent(reason=forged, requester="r" * 900, params={"value": "v" * 900}), CONSOLE)
    assert "\n" not in request.reason and "\u202e" not in request.reason and "\u200b" not in request.reason
    assert len(request.reason) == REASON_LIMIT and request.reason.endswith("…")
    assert len(request.requester) <= 128 and isinstance(request.value, str) and len(request.value) <= VALUE_LIMIT
    for kind in ("ntfy", "slack", "json"):
        message = render(kind, approval_request(intent(reason=forged), CONSOLE))
        assert len(message.body) < 4096, kind
    text = render("ntfy", request).body.decode()
    assert len(text) <= TEXT_LIMIT and text.count("\n") == 3  # its own four lines, none forged
    assert clean("a\tb\x1b[31mc", 20) == "a b [31mc"


def test_a_non_ascii_title_is_an_rfc_2047_word() -> None:
    body = intent()
    body["metadata"]["namespace"] = "maison"
    body["spec"]["device"] = "porte-d-entrée"  # not a DNS label, but a message must not depend on the CRD
    title = render("ntfy", approval_request(body, CONSOLE)).headers["Title"]
    assert title.startswith("=?UTF-8?B?") and title.isascii()


# ---- retries -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "expected"), [
    (200, "sent"), (201, "sent"), (204, "sent"), (429, "retry"), (500, "retry"), (502, "retry"), (503, "retry"),
    (400, "fail"), (401, "fail"), (403, "fail"), (404, "fail"), (408, "fail"), (413, "fail"), (301, "fail"),
])
def test_only_429_and_5xx_are_retried(status: int, expected: str) -> None:
    assert verdict(status) == expected


def test_retry_after_in_seconds_or_as_a_date_and_bounded() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    assert retry_after_seconds("7", now) == 7.0
    assert retry_after_seconds(format_datetime(now + timedelta(seconds=30), usegmt=True), now) == 30.0
    assert retry_after_seconds(format_datetime(now - timedelta(seconds=30), usegmt=True), now) == 0.0
    assert retry_after_seconds("soon", now) is None and retry_after_seconds(None, now) is None
    assert next_delay(2.0, None, 15.0) == 2.0
    assert next_delay(2.0, 7.0, 15.0) == 7.0  # the receiver asked for longer
    assert next_delay(4.0, 1.0, 15.0) == 4.0  # never sooner than the backoff
    assert next_delay(2.0, 3600.0, 15.0) == 15.0  # never beyond the bound


def test_an_error_answer_is_described_without_the_webhooks_secrets() -> None:
    hook = Webhook("phone", "ntfy", "https://ntfy.example/secret-topic-42?auth=tok", {"Authorization": "Bearer tk_x"})
    answer = b'{"error": "topic /secret-topic-42?auth=tok is over quota", "token": "Bearer tk_x"}\n' + b"z" * 900
    described = describe_answer(429, answer, hook.secrets())
    assert described.startswith("HTTP 429: ") and len(described) < 230
    assert "secret-topic-42" not in described and "tk_x" not in described and "[redacted]" in described
    assert "secret" not in repr(hook) and "tk_x" not in repr(hook)


# ---- the configuration file ----------------------------------------------------------------------------------


def errors_of(data: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        NotifyConfig.model_validate(data)
    return describe_errors(caught.value)


def test_a_good_config_with_defaults() -> None:
    config = NotifyConfig.model_validate({"webhooks": [
        {"name": "phone", "kind": "ntfy", "urlFile": "/etc/corral/notify/phone-url"},
        {"name": "team", "kind": "slack", "url": "https://hooks.slack.example/T/B/x", "headers": {"X-A": "b"}},
    ], "retry": {"attempts": 3, "initialDelaySeconds": 0.5}})
    assert [w.name for w in config.webhooks] == ["phone", "team"]
    assert (config.retry.attempts, config.retry.initial_delay_seconds, config.retry.max_delay_seconds) == (3, 0.5, 15)


@pytest.mark.parametrize(("data", "expected"), [
    ({"webhooks": [{"name": "p", "kind": "teams", "url": "https://x.example"}]},
     "webhooks[0].kind: Input should be 'ntfy', 'slack' or 'json'"),
    ({"webhooks": [{"name": "Phone 1", "kind": "ntfy", "url": "https://x.example"}]},
     "webhooks[0].name: must be a DNS label"),
    ({"webhooks": [{"name": "p", "kind": "ntfy"}]}, "webhooks[0]: give exactly one of url and urlFile"),
    ({"webhooks": [{"name": "p", "kind": "ntfy", "url": "https://x.example", "urlFile": "/f"}]},
     "webhooks[0]: give exactly one of url and urlFile"),
    ({"webhooks": [{"name": "p", "kind": "ntfy", "url": "ftp://secret-host/secret-path"}]},
     "webhooks[0].url: must be an http:// or https:// URL with a host"),
    ({"webhooks": [{"name": "p", "kind": "ntfy", "url": "https://x.example", "secret": "s"}]},
     "webhooks[0].secret: unknown field; allowed: name, kind, url, urlFile, headers, headersFile"),
    ({"webhooks": [{"kind": "ntfy", "url": "https://x.example"}]}, "webhooks[0].name: is required"),
    ({"webhooks": [{"name": "p", "kind": "json", "url": "https://x.example", "headers": {"X-A": "a\r\nX-B: b"}}]},
     "webhooks[0].headers: the value of header X-A holds control characters"),
    ({"webhook": []}, "webhook: unknown field; allowed: webhooks, retry"),
    ({"retry": {"attempts": 0}}, "retry.attempts: Input should be greater than or equal to 1"),
    ({"retry": {"tries": 3}}, "retry.tries: unknown field; allowed: attempts, initialDelaySeconds, maxDelaySeconds, "
                              "timeoutSeconds"),
    ({"retry": {"initialDelaySeconds": 10, "maxDelaySeconds": 2}},
     "retry: maxDelaySeconds must be at least initialDelaySeconds"),
    ({"webhooks": [{"name": "p", "kind": "json", "url": "https://x.example"},
                   {"name": "p", "kind": "slack", "url": "https://y.example"}]},
     "(the file): webhook names must be unique: p appear"),
])
def test_config_errors_name_the_field_and_what_is_allowed(data: dict[str, Any], expected: str) -> None:
    described = errors_of(data)
    assert expected in described
    assert "secret-" not in described and "X-B" not in described  # never the values given


def test_header_lines_files() -> None:
    assert parse_header_lines("# ntfy\nAuthorization: Bearer tk_1:2\n\nX-Other:  v \n") == {
        "Authorization": "Bearer tk_1:2", "X-Other": "v"}
    with pytest.raises(ValueError, match="line 2 is not `Name: value`"):
        parse_header_lines("A: b\nBearer tk_secret\n")
    with pytest.raises(ValueError, match="line 1: header name 'Bad Name' is not an HTTP token"):
        parse_header_lines("Bad Name: x")


def test_load_config_reads_urls_and_headers_from_files_and_says_which_field_is_wrong(tmp_path: Path) -> None:
    (tmp_path / "url").write_text("https://ntfy.example/topic-s3cret\n")
    (tmp_path / "headers").write_text("Authorization: Bearer tk_abc\n")
    config = tmp_path / "notify.yaml"
    config.write_text(f"webhooks:\n  - {{name: phone, kind: ntfy, urlFile: {tmp_path / 'url'}, "
                      f"headersFile: {tmp_path / 'headers'}, headers: {{X-Static: '1'}}}}\n"
                      "retry: {attempts: 2}\n")
    settings = load_config(config)
    (hook,) = settings.webhooks
    assert (hook.name, hook.kind, hook.url) == ("phone", "ntfy", "https://ntfy.example/topic-s3cret")
    assert hook.headers == {"X-Static": "1", "Authorization": "Bearer tk_abc"} and settings.retry.attempts == 2
    # JSON is YAML too.
    config.write_text(json.dumps({"webhooks": [{"name": "j", "kind": "json", "url": "http://127.0.0.1:9/x"}]}))
    assert load_config(config).webhooks[0].url == "http://127.0.0.1:9/x"
    (tmp_path / "url").write_text("not a url s3cret")
    config.write_text(f"webhooks: [{{name: phone, kind: ntfy, urlFile: {tmp_path / 'url'}}}]")
    with pytest.raises(ValueError, match=r"webhooks\[0\] \(phone\)\.urlFile .*: must be an http") as caught:
        load_config(config)
    assert "s3cret" not in str(caught.value)
    config.write_text(f"webhooks: [{{name: phone, kind: ntfy, urlFile: {tmp_path / 'missing'}}}]")
    with pytest.raises(ValueError, match="cannot be read: No such file"):
        load_config(config)
    config.write_text("- just a list")
    with pytest.raises(ValueError, match="must be a mapping with `webhooks`"):
        load_config(config)
    config.write_text("webhooks: [{name: x, kind: teams, url: 'https://x.example'}]")
    with pytest.raises(ValueError, match=r"notify.yaml: webhooks\[0\]\.kind: Input should be 'ntfy', 'slack' or 'json'"):
        load_config(config)


def test_corral_run_refuses_a_bad_config_or_console_url_before_it_starts(tmp_path: Path) -> None:
    config = tmp_path / "notify.yaml"
    config.write_text("webhooks: [{name: phone, kind: teams, url: 'https://ntfy.example/s3cret'}]")
    result = CliRunner().invoke(cli, ["run", "--mqtt", "mqtt://u@127.0.0.1:1", "--notify-config", str(config)])
    assert result.exit_code == 2
    assert "Invalid value for --notify-config" in result.stderr
    assert "webhooks[0].kind: Input should be 'ntfy', 'slack' or 'json'" in result.stderr
    assert "s3cret" not in result.stderr
    config.write_text("webhooks: []")
    result = CliRunner().invoke(cli, ["run", "--mqtt", "mqtt://u@127.0.0.1:1", "--notify-config", str(config),
                                      "--console-url", "console.example"])
    assert result.exit_code == 2 and "Invalid value for --console-url" in result.stderr


def test_the_intent_model_makes_the_same_request_as_its_body() -> None:
    body = intent()
    assert approval_request(Intent.model_validate(body), CONSOLE) == approval_request(body, CONSOLE)
