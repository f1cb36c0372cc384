"""What the review server checks before it serves a request, and how it echoes what it refuses.

- Address: on a loopback bind the UI is served under a fresh unguessable name,
  `r-<random>.localhost` (browsers resolve `*.localhost` to loopback by themselves). Cookies are
  scoped by host name, not port, so a page of another local server (127.0.0.1 or localhost on
  any port) never receives the session cookie and cannot set one for this name.
- Host: exactly this server's name and port (DNS rebinding; a replayed cookie needs the name
  too); Origin: exactly this server's, scheme included, on any request that carries one, and
  never `null` (an opaque origin: a sandboxed frame, a `data:` page, a cross-origin redirect).
  Pages are sent with `Referrer-Policy: same-origin`, under which the browser's own same-origin
  form posts carry the real origin. A non-loopback bind is reached under names this server
  cannot know: there only the Origin is checked (against the Host the client used).
- The login token is exchanged for a session only when the browser says the request is a direct
  navigation (typed, pasted, bookmarked: `Sec-Fetch-Site: none`) or came from this server; a
  token link followed from another site (even another port of 127.0.0.1) does not log in.
  Clients that send no `Sec-Fetch-Site` (command-line tools) are judged by Referer and Origin.
- Sizes, from the request head alone: a URL longer than `MAX_URL_CHARS` gets 414 and a body
  over `MAX_BODY_BYTES` 413 (the HTTP layer accepts request heads up to `MAX_HEAD_BYTES`, so a
  long URL is answered, not cut off); a body framed by `Transfer-Encoding` is refused (411, or
  400 beside a Content-Length: two framings a proxy and this server could read differently).
- Anything echoed back from a request (an id, a path, a header) is cut to a few dozen
  characters with the cut said (`shown`); error text loses its filesystem paths (`pathless`).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import Headers

MAX_URL_CHARS = 8192
"""Longest path + query answered (characters); longer gets 414."""
MAX_BODY_BYTES = 2 * 1024 * 1024
"""Largest request body read (bytes); larger gets 413."""
MAX_HEAD_BYTES = 1024 * 1024
"""Largest request head the HTTP layer reads (bytes): enough to answer any long URL with 414."""
NAMED_BINDS = {"127.0.0.1", "::1", "localhost"}
"""Binds a browser reaches under `*.localhost` (it resolves those names to 127.0.0.1 and ::1)."""


class Refused(Exception):
    """A request the server will not serve: rendered as a short page with this status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def shown(text: str, limit: int = 64) -> str:
    """`text` as a page may show it: at most `limit` characters, and a longer text says how much
    is not shown."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters not shown)"


_PATH = re.compile(r"(?<![\w.:/-])(?:~|\.{1,2})?/(?:[\w.@+-]+/)*([\w.@+-]+/?)")


def pathless(text: str) -> str:
    """`text` with every filesystem path cut to its last part (`…/index.lock`): error pages do
    not show where the server keeps its data (its log keeps the whole message)."""
    return _PATH.sub(lambda m: "…/" + m.group(1) if m.group(0).count("/") > 1 else m.group(0), text)


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, IPv6 with or without brackets) is this machine
    only: localhost, any of 127.0.0.0/8, ::1."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Address:
    """Where the UI is served: the host name in its URLs and its port."""

    name: str
    port: int
    checked: bool
    """Whether Host must be exactly `authority` (every loopback bind)."""

    @classmethod
    def for_bind(cls, host: str, port: int) -> Address:
        """The address of a server bound to `host`:`port`: a fresh `r-<random>.localhost` on
        127.0.0.1, ::1 or localhost; the address itself on another loopback address (browsers
        send `*.localhost` only to 127.0.0.1 and ::1); unchecked on any other interface."""
        if host.strip("[]").lower() in NAMED_BINDS:
            return cls(f"r-{secrets.token_hex(10)}.localhost", port, checked=True)
        name = f"[{host.strip('[]')}]" if ":" in host else host
        return cls(name.lower(), port, checked=is_loopback(host))

    @property
    def authority(self) -> str:
        """`name:port`, as a browser writes it in Host (port 80 left out)."""
        return self.name if self.port == 80 else f"{self.name}:{self.port}"

    @property
    def origin(self) -> str:
        return f"http://{self.authority}"


def _origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def check_host_and_origin(headers: Headers, address: Address) -> None:
    """Refuse a Host that is not this server, and an Origin that is not its own (or `null`)."""
    host = headers.get("host", "")
    if address.checked and host.lower() != address.authority:
        raise Refused(403, f"host '{shown(host)}' is not this review server")
    expected = address.origin if address.checked else f"http://{host}".lower()
    origin = headers.get("origin")
    if origin is not None and origin.lower() != expected:
        raise Refused(403, f"cross-origin request refused (Origin: {shown(origin)})")


def check_login_source(headers: Headers, address: Address) -> None:
    """Refuse a token login that did not come from a direct navigation or from this server."""
    site = headers.get("sec-fetch-site")
    referer = headers.get("referer")
    if site is not None:
        ok = site in ("none", "same-origin")
    else:
        expected = address.origin if address.checked else f"http://{headers.get('host', '')}"
        ok = referer is None or _origin_of(referer) == expected.lower()
    if not ok:
        raise Refused(
            403,
            "this login link was followed from another site, so it does not sign you in: "
            "paste the URL printed when the server started into the address bar",
        )


def check_head(raw_target: int, headers: Headers) -> int:
    """Refuse a URL of `raw_target` characters over MAX_URL_CHARS (414), a body framed by
    Transfer-Encoding (411; 400 beside a Content-Length) or over MAX_BODY_BYTES (413). Returns
    the body's announced length (bytes)."""
    if raw_target > MAX_URL_CHARS:
        raise Refused(414, f"URL of {raw_target:,} characters refused (at most {MAX_URL_CHARS:,})")
    lengths = headers.getlist("content-length")
    if "transfer-encoding" in headers:
        if lengths:
            raise Refused(
                400, "a request with both Transfer-Encoding and Content-Length is refused"
            )
        raise Refused(411, "a request body needs a Content-Length (a chunked body is refused)")
    length = lengths[0] if len(lengths) == 1 else ",".join(lengths) or "0"
    if not length.isdigit() or int(length) > MAX_BODY_BYTES:
        raise Refused(
            413, f"request body of {shown(length)} bytes refused (at most {MAX_BODY_BYTES:,})"
        )
    return int(length)


def safe_redirect(path: str) -> str:
    """`path` as a redirect target that stays on this server (`//host` and `/\\host` lose their
    extra slashes)."""
    return "/" + path.lstrip("/\\")


log = logging.getLogger("infra_agent.review")


def failure(exc: Exception) -> str:
    """An error's message as a page shows it: short and without filesystem paths (the server's
    log keeps it whole)."""
    log.warning("review: %s", exc)
    return shown(pathless(str(exc)), 600)
