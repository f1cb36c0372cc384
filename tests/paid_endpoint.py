"""TEST STAND-IN for the paid model endpoint (Z.ai's API, or SGLang serving GLM).

A real HTTP server on 127.0.0.1 (started and stopped by the test) that records every request
body and answers /v1/chat/completions from a queue the test writes. It never decides anything:
each reply is scripted. Queue entries:

- `("reply", Reply(...))`: a GLM-shaped stream: reasoning deltas, content, tool calls whose
  arguments arrive in fragments (when the request asks for `tool_stream`, as Z.ai does; without
  it a call's arguments come whole, after everything else), and usage with reasoning and cached
  tokens. `shape="zai"` puts usage in the last chunk unasked (Z.ai); `shape="sglang"` sends a
  usage-only chunk when the request asks for it (`stream_options.include_usage`).
- `("stream", chunks)`: these chunks as they are, then usage (100 prompt, 7 completion tokens).
- `("status", code)`: an error response with Retry-After: 0.
- `("hang", None)`: no answer until the client times out and hangs up.

`refuse` names request fields answered with 400 (an endpoint that rejects what it does not take).
An empty queue answers with content only (no tool call).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal


def chunk(
    delta: dict[str, Any],
    *,
    logprobs: list[tuple[str, float]] | None = None,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
    if logprobs:
        choice["logprobs"] = {
            "content": [
                {"token": t, "logprob": p, "bytes": None, "top_logprobs": []} for t, p in logprobs
            ]
        }
    out: dict[str, Any] = {
        "id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "stand-in",
        "choices": [choice],
    }  # fmt: skip
    if usage is not None:
        out["usage"] = usage
    return out


def tool_call_reply(
    name: str, arguments: str, *, content: str = "", reasoning: str = ""
) -> list[dict[str, Any]]:
    """Raw chunks of a reply whose tool call's arguments arrive split over two chunks."""
    half = len(arguments) // 2
    first = {
        "index": 0, "id": "call_1", "type": "function",
        "function": {"name": name, "arguments": arguments[:half]},
    }  # fmt: skip
    second = {"index": 0, "function": {"arguments": arguments[half:]}}
    return [
        chunk(
            {"role": "assistant", "content": content, "reasoning_content": reasoning},
            logprobs=[("x", -0.5)],
        ),
        chunk({"tool_calls": [first]}),
        chunk({"tool_calls": [second]}),
    ]


@dataclass
class Usage:
    """What a reply reports it used (tokens)."""

    prompt: int = 1000
    completion: int = 60
    cached: int | None = None
    reasoning: int | None = None


@dataclass
class Reply:
    """One scripted GLM-shaped reply."""

    reasoning: str = ""
    content: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)
    """(tool name, arguments as JSON text)."""
    usage: Usage = field(default_factory=Usage)
    pieces: int = 4
    """Fragments the reasoning and each streamed argument text are cut into."""


def _cut(text: str, pieces: int) -> list[str]:
    step = max(1, -(-len(text) // pieces))
    return [text[i : i + step] for i in range(0, len(text), step)] or [""]


def glm_chunks(
    reply: Reply, request: dict[str, Any], n: int, shape: Literal["zai", "sglang"]
) -> list[dict[str, Any]]:
    """The chunks of `reply` as a GLM endpoint of `shape` streams them for `request`."""
    out = [chunk({"role": "assistant", "reasoning_content": part}) for part in _cut(reply.reasoning, reply.pieces) if part]  # fmt: skip
    if reply.content:
        out.append(chunk({"content": reply.content}))
    fragments = request.get("tool_stream") is True or shape == "sglang"
    whole = []
    for i, (name, arguments) in enumerate(reply.calls):
        head = {"index": i, "id": f"call_{n}_{i}", "type": "function"}
        if fragments:
            out.append(
                chunk({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]})
            )
            for part in _cut(arguments, reply.pieces):
                out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": part}}]}))
        else:  # buffered: the whole call once it is generated
            whole.append({**head, "function": {"name": name, "arguments": arguments}})
    if whole:
        out.append(chunk({"tool_calls": whole}))
    u = reply.usage
    usage: dict[str, Any] = {
        "prompt_tokens": u.prompt, "completion_tokens": u.completion,
        "total_tokens": u.prompt + u.completion,
    }  # fmt: skip
    if u.cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": u.cached}
    if u.reasoning is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": u.reasoning}
        if shape == "sglang":
            usage["reasoning_tokens"] = u.reasoning
    finish = "tool_calls" if reply.calls else "stop"
    if shape == "zai":
        out.append(chunk({}, finish=finish, usage=usage))
    else:
        out.append(chunk({}, finish=finish))
        if (request.get("stream_options") or {}).get("include_usage"):
            out.append({**chunk({}), "choices": [], "usage": usage})
    return out


def glm_completion(reply: Reply, n: int) -> dict[str, Any]:
    """`reply` as one JSON completion (a request that did not ask to stream)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    if reply.calls:
        message["tool_calls"] = [
            {"id": f"call_{n}_{i}", "type": "function", "function": {"name": a, "arguments": b}}
            for i, (a, b) in enumerate(reply.calls)
        ]
    u = reply.usage
    return {
        "id": "c1", "object": "chat.completion", "created": 0, "model": "stand-in",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": u.prompt, "completion_tokens": u.completion,
                  "total_tokens": u.prompt + u.completion},
    }  # fmt: skip


class PaidEndpointStandIn:
    """The test stand-in for the paid model endpoint (see the module docstring)."""

    chunk = staticmethod(chunk)
    tool_call_reply = staticmethod(tool_call_reply)

    def __init__(
        self, *, shape: Literal["zai", "sglang"] = "zai", refuse: tuple[str, ...] = ()
    ) -> None:
        self.queue: list[tuple[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        """Every request body received, in order."""
        self.sent: list[list[dict[str, Any]]] = []
        """The chunks streamed back, per answered request."""
        self.shape = shape
        self.refuse = refuse
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, code: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Retry-After", "0")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.requests.append(body)
                refused = [f for f in endpoint.refuse if f in body]
                if refused:
                    self._json(400, {"error": {"message": f"unsupported field {refused[0]}"}})
                    return
                entry: tuple[str, Any] = (
                    endpoint.queue.pop(0) if endpoint.queue else ("stream", [chunk({"content": "done?"})])
                )  # fmt: skip
                kind, value = entry
                if kind == "hang":  # no answer: wait until the client times out and hangs up
                    while self.rfile.read(1):
                        pass
                    return
                if kind == "status":
                    self._json(value, {"error": {"message": f"stand-in {value}", "type": "x"}})
                    return
                if kind == "reply" and not body.get("stream"):
                    self._json(200, glm_completion(value, len(endpoint.requests)))
                    return
                if kind == "reply":
                    chunks = glm_chunks(value, body, len(endpoint.requests), endpoint.shape)
                else:
                    usage = {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107}
                    chunks = [*value, {**chunk({}), "choices": [], "usage": usage}]
                endpoint.sent.append(chunks)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for item in chunks:
                    self.wfile.write(f"data: {json.dumps(item)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
