"""What protects the page from other sites: the origin check, and the headers every response carries.

A person's browser sends their session cookie with any request to the console, whoever made the page that
sends it. SameSite=Strict keeps it off requests from other *sites*, but not from another port or subdomain
of the same site (a site is scheme and registrable domain; http://127.0.0.1:9999 is the same site as
http://127.0.0.1:8080). So every state-changing request must also say it comes from the console's own origin
(`Origin`, and `Sec-Fetch-Site` where the browser sends it), and carry the session's CSRF token, which
only the console's own page can read. Pure: unit-tested.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final
from urllib.parse import urlsplit

UNSAFE_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CSRF_HEADER: Final = "X-CSRF-Token"
CSRF_FIELD: Final = "csrf"

CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: Final[Mapping[str, str]] = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
}
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


def origin_of(url: str) -> str | None:
    """The origin of a URL as a browser writes it in `Origin` (scheme://host[:port], default port left out),
    or None when it has none (not http/https, no host)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in _DEFAULT_PORTS or not host:
        return None
    if ":" in host:
        host = f"[{host}]"  # IPv6
    return f"{scheme}://{host}" + (f":{port}" if port is not None and port != _DEFAULT_PORTS[scheme] else "")


def own_origins(public_url: str | None, host: str, port: int, extra: Iterable[str] = ()) -> frozenset[str]:
    """The origins the page is served from: the public URL's, the listening address's (with localhost and the
    loopback addresses for one bound to loopback or to every address), and any given."""
    origins = {origin_of(url) for url in [*(extra or ()), *([public_url] if public_url else [])]}
    names = {host}
    if host in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "::", ""):
        names |= {"127.0.0.1", "localhost", "::1"}
    for name in names - {"0.0.0.0", "::", ""}:
        origins.add(origin_of(f"http://{f'[{name}]' if ':' in name else name}:{port}"))
    return frozenset(o for o in origins if o)


def cross_site_refusal(method: str, headers: Mapping[str, str], request_origin: str | None,
                       allowed: frozenset[str], api: bool) -> str | None:
    """Why this request must be refused as coming from another origin, or None.

    `request_origin`: scheme://Host of the request itself (accepted as the page's own origin too).
    `api`: an endpoint only the page's own scripts call (a GET there from another site is refused as well;
    a page navigation, e.g. a link in a notification, is a GET of the HTML and always allowed)."""
    unsafe = method.upper() in UNSAFE_METHODS
    if not unsafe and not api:
        return None
    fetch_site = (headers.get("Sec-Fetch-Site") or "").strip().lower()
    if fetch_site in ("cross-site", "same-site"):
        return (f"Refused: this request was sent by a page on another site (Sec-Fetch-Site: {fetch_site}), not by "
                "the approval page. Approve and deny only on the approval page itself.")
    if not unsafe:
        return None
    origin = headers.get("Origin")
    if origin is None:
        # No browser sends a state-changing request without Origin any more; a client without one (curl) was
        # not lured by a web page, and still needs the session's CSRF token.
        return None
    shown = "".join(c if c.isprintable() else "?" for c in origin[:200])
    normalized = origin_of(origin) if origin.strip().lower() != "null" else None
    if normalized is None or normalized not in allowed | ({request_origin} if request_origin else set()):
        return (f"Refused: this request came from another origin ({shown}), not from the approval page. "
                "Approve and deny only on the approval page itself.")
    return None
