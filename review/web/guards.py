"""What the review server checks before it serves a request, and how it echoes what it refuses.

- Host: this server's loopback name (DNS rebinding); Origin: this server's, on any request that
  carries one, and never `null` (an opaque origin: a sandboxed frame, a `data:` page, a
  cross-origin redirect). Pages are sent with `Referrer-Policy: same-origin`, under which the
  browser's own same-origin form posts carry the real origin.
- The login token is exchanged for a session only when the browser says the request is a direct
  navigation (typed, pasted, bookmarked: `Sec-Fetch-Site: none`) or came from this server; a
  token link followed from another site (even another port of 127.0.0.1) does not log in.
  Clients that send no `Sec-Fetch-Site` (command-line tools) are judged by Referer and Origin.
- Sizes: a URL longer than `MAX_URL_CHARS` gets 414 and a body over `MAX_BODY_BYTES` 413 (the
  HTTP layer accepts request heads up to `MAX_HEAD_BYTES`, so a long URL is answered, not cut off);
  a body without a Content-Length (chunked) gets 411, so the body limit cannot be sidestepped.
- Anything echoed back from a request (an id, a path, a header) is cut to a few dozen
  characters with the cut said (`shown`).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import Request

MAX_URL_CHARS = 8192
"""Longest path + query answered (characters); longer gets 414."""
MAX_BODY_BYTES = 2 * 1024 * 1024
"""Largest request body read (bytes); larger gets 413."""
MAX_HEAD_BYTES = 1024 * 1024
"""Largest request head the HTTP layer reads (bytes): enough to answer any long URL with 414."""
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1", "[::1]"}


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


def check_host_and_origin(request: Request, *, loopback_only: bool) -> None:
    """Refuse a Host that is not this server, and an Origin that is not its own (or `null`)."""
    host = request.headers.get("host", "")
    if loopback_only and urlsplit(f"//{host}").hostname not in {
        n.strip("[]") for n in LOOPBACK_NAMES
    }:
        raise Refused(403, f"host '{shown(host)}' is not this review server")
    origin = request.headers.get("origin")
    if origin is not None and (origin == "null" or urlsplit(origin).netloc != host):
        raise Refused(403, f"cross-origin request refused (Origin: {shown(origin)})")


def check_login_source(request: Request) -> None:
    """Refuse a token login that did not come from a direct navigation or from this server."""
    host = request.headers.get("host", "")
    site = request.headers.get("sec-fetch-site")
    referer = request.headers.get("referer")
    if site is not None:
        ok = site in ("none", "same-origin")
    else:
        ok = referer is None or urlsplit(referer).netloc == host
    if not ok:
        raise Refused(
            403,
            "this login link was followed from another site, so it does not sign you in: "
            "paste the URL printed when the server started into the address bar",
        )


def check_size(request: Request) -> None:
    """Refuse a URL over MAX_URL_CHARS (414), a body over MAX_BODY_BYTES (413) or of unstated
    length (411)."""
    target = len(request.scope.get("raw_path") or b"") + len(request.scope.get("query_string", b""))
    if target > MAX_URL_CHARS:
        raise Refused(414, f"URL of {target:,} characters refused (at most {MAX_URL_CHARS:,})")
    if "transfer-encoding" in request.headers and "content-length" not in request.headers:
        raise Refused(411, "a request body needs a Content-Length (a chunked body is refused)")
    length = request.headers.get("content-length", "0")
    if not length.isdigit() or int(length) > MAX_BODY_BYTES:
        raise Refused(
            413, f"request body of {shown(length)} bytes refused (at most {MAX_BODY_BYTES:,})"
        )
