"""What keeps other sites out of the approval page (console/guard.py, console/sessions.py) and what the
page's own files may do (console/static: no inline code, nothing from the cluster set as HTML)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from corral.console.app import static_dir
from corral.console.guard import CONTENT_SECURITY_POLICY, SECURITY_HEADERS, cross_site_refusal, origin_of, own_origins
from corral.console.people import SignInRefused, clean_token
from corral.console.sessions import SessionStore

REPO = Path(__file__).resolve().parents[2]
OWN = own_origins(None, "127.0.0.1", 8080)


@pytest.mark.parametrize(("url", "origin"), [
    ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
    ("HTTPS://Approve.Example:443/path?x", "https://approve.example"),
    ("http://example:80", "http://example"),
    ("http://[::1]:8080", "http://[::1]:8080"),
    ("null", None), ("file:///etc/passwd", None), ("https://", None), ("http://host:99999", None),
])
def test_origins_are_compared_as_browsers_write_them(url: str, origin: str | None) -> None:
    assert origin_of(url) == origin


def test_the_page_own_origins() -> None:
    assert own_origins(None, "127.0.0.1", 8080) == {"http://127.0.0.1:8080", "http://localhost:8080", "http://[::1]:8080"}
    assert own_origins("https://approve.home.example/", "0.0.0.0", 8080, ["http://localhost:9000"]) == {
        "https://approve.home.example", "http://localhost:9000",
        "http://127.0.0.1:8080", "http://localhost:8080", "http://[::1]:8080"}
    assert own_origins(None, "10.0.0.5", 8080) == {"http://10.0.0.5:8080"}


def refusal(method: str, headers: dict[str, str], api: bool = True) -> str | None:
    return cross_site_refusal(method, headers, "http://127.0.0.1:8080", OWN, api=api)


@pytest.mark.parametrize("headers", [
    {"Origin": "http://127.0.0.1:8080", "Sec-Fetch-Site": "same-origin"},
    {"Origin": "http://localhost:8080"},
    {},  # not a browser (curl): still needs the session's CSRF token
    {"Sec-Fetch-Site": "same-origin"},
    {"Sec-Fetch-Site": "none"},
])
def test_a_post_from_the_page_itself_passes(headers: dict[str, str]) -> None:
    assert refusal("POST", headers) is None


@pytest.mark.parametrize("headers", [
    {"Origin": "http://127.0.0.1:9999"},  # the same site on another port: SameSite cookies do go there
    {"Origin": "http://127.0.0.1:9999", "Sec-Fetch-Site": "same-site"},
    {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "cross-site"},
    {"Origin": "null"},  # a sandboxed frame, a data: URL
    {"Origin": "http://127.0.0.1:8080", "Sec-Fetch-Site": "same-site"},
    {"Origin": "http://127.0.0.1:8080.evil.example"},
])
def test_a_post_from_another_origin_is_refused_with_a_reason(headers: dict[str, str]) -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH", "post"):
        reason = refusal(method, headers)
        assert reason is not None and reason.startswith("Refused:") and "approval page" in reason


def test_the_request_own_host_counts_as_its_origin_for_a_console_on_every_address() -> None:
    origins = own_origins(None, "0.0.0.0", 8080)
    assert cross_site_refusal("POST", {"Origin": "http://console.lan:8080"}, "http://console.lan:8080",
                              origins, api=True) is None
    assert cross_site_refusal("POST", {"Origin": "http://other.lan:8080"}, "http://console.lan:8080",
                              origins, api=True) is not None


def test_pages_may_be_opened_from_anywhere_but_the_api_is_the_page_own() -> None:
    # a link in a notification opens /intents/NS/NAME: a cross-site navigation, a GET of the page
    assert refusal("GET", {"Sec-Fetch-Site": "cross-site"}, api=False) is None
    assert refusal("GET", {"Sec-Fetch-Site": "cross-site"}, api=True) is not None
    assert refusal("GET", {"Sec-Fetch-Site": "same-origin"}, api=True) is None
    assert refusal("GET", {}, api=True) is None


def test_an_odd_origin_is_shown_printable() -> None:
    reason = refusal("POST", {"Origin": "http://evil\x1b[31m.example"})
    assert reason is not None and "\x1b" not in reason


def test_every_response_header_is_strict() -> None:
    for directive in ("default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'",
                      "img-src 'self'", "form-action 'self'", "frame-ancestors 'none'", "base-uri 'none'"):
        assert directive in CONTENT_SECURITY_POLICY
    assert "unsafe" not in CONTENT_SECURITY_POLICY
    assert SECURITY_HEADERS["X-Content-Type-Options"] == "nosniff"
    assert SECURITY_HEADERS["Referrer-Policy"] == "no-referrer"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_sessions_end_when_idle_too_long_or_too_old_or_signed_out() -> None:
    clock = Clock()
    store = SessionStore(max_age_s=8 * 3600, idle_s=3600, clock=clock)
    session, _ = store.create("token-a", "alice", ("people",))
    assert store.get(session.id) is session and session.username == "alice"
    assert store.get("not-a-session") is None and store.get(None) is None
    for _ in range(8):  # in use every 59 minutes: alive until 8 h after sign-in
        clock.now += 59 * 60
        assert store.get(session.id) is session
    clock.now = session.created + 8 * 3600
    assert store.get(session.id) is None
    assert store.expire() == [session] and len(store) == 0

    idle, _ = store.create("token-b", "bob", ())
    clock.now += 3600
    assert store.get(idle.id) is None

    gone, _ = store.create("token-c", "carol", ())
    assert store.end(gone.id) is gone and store.get(gone.id) is None


def test_session_ids_and_csrf_tokens_are_random_and_checked_in_constant_time() -> None:
    store = SessionStore(clock=Clock())
    one, _ = store.create("s3cret-token", "u", ())
    two, _ = store.create("s3cret-token", "u", ())
    assert len({one.id, two.id, one.csrf, two.csrf}) == 4 and len(one.id) >= 40
    assert one.csrf_matches(one.csrf) and not one.csrf_matches(two.csrf) and not one.csrf_matches(None)
    assert "s3cret-token" not in repr(one) and one.csrf not in repr(one)  # logs never show them


def test_too_many_sessions_push_out_the_least_recently_used() -> None:
    clock = Clock()
    store = SessionStore(max_sessions=2, clock=clock)
    first, _ = store.create("1", "a", ())
    clock.now += 1
    second, _ = store.create("2", "b", ())
    clock.now += 1
    store.get(first.id)
    _, pushed = store.create("3", "c", ())
    assert pushed == [second] and store.get(first.id) is first


@pytest.mark.parametrize(("pasted", "token"), [
    ("  eyJ.a.b\n", "eyJ.a.b"), ("Bearer eyJ.a.b", "eyJ.a.b"), ("bearer  abc", "abc")])
def test_a_pasted_token_is_cleaned(pasted: str, token: str) -> None:
    assert clean_token(pasted) == token


@pytest.mark.parametrize("pasted", ["", "   ", "two words", "abc\r\nX-Injected: 1", "ü" * 10, "a" * 20_000])
def test_what_cannot_be_a_token_is_refused_before_any_request(pasted: str) -> None:
    with pytest.raises(SignInRefused):
        clean_token(pasted)


def test_the_page_has_no_inline_code_and_sets_nothing_from_the_cluster_as_html() -> None:
    html = (static_dir() / "index.html").read_text()
    assert re.search(r"<script(?![^>]*\ssrc=)", html) is None, "inline script"
    assert "<style" not in html and re.search(r"\sstyle=", html) is None, "inline style"
    assert re.search(r"\son[a-z]+=", html) is None, "inline event handler"
    assert '<meta name="viewport"' in html
    script = (static_dir() / "app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script, sink


def test_the_static_files_are_package_data() -> None:
    settings = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "static/*" in settings["package-data"]["corral.console"]
    assert {p.name for p in static_dir().iterdir()} >= {"index.html", "app.js", "style.css"}
