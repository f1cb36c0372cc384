"""Test equipment for the agent tests: a fake OpenAI-compatible endpoint on 127.0.0.1, and a quick
copy of a bundled task (same code and harness, smaller measurement budget)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest


def chunk(
    delta: dict[str, Any], *, logprobs: list[tuple[str, float]] | None = None
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
    if logprobs:
        choice["logprobs"] = {
            "content": [
                {"token": t, "logprob": p, "bytes": None, "top_logprobs": []} for t, p in logprobs
            ]
        }
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake",
        "choices": [choice],
    }


def tool_call_reply(
    name: str, arguments: str, *, content: str = "", reasoning: str = ""
) -> list[dict[str, Any]]:
    """A streamed reply whose tool call's arguments arrive split over two chunks."""
    half = len(arguments) // 2
    first = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": name, "arguments": arguments[:half]},
    }
    second = {"index": 0, "function": {"arguments": arguments[half:]}}
    return [
        chunk(
            {"role": "assistant", "content": content, "reasoning_content": reasoning},
            logprobs=[("x", -0.5)],
        ),
        chunk({"tool_calls": [first]}),
        chunk({"tool_calls": [second]}),
    ]


class FakeEndpoint:
    """Answers /v1/chat/completions from a queue: ('status', code), ('hang', None): no answer
    until the client hangs up, ('stream', chunks)."""

    chunk = staticmethod(chunk)
    tool_call_reply = staticmethod(tool_call_reply)

    def __init__(self) -> None:
        self.queue: list[tuple[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.requests.append(body)
                kind, value = (
                    endpoint.queue.pop(0)
                    if endpoint.queue
                    else ("stream", [chunk({"content": "done?"})])
                )
                if kind == "hang":  # no answer: wait until the client times out and hangs up
                    while self.rfile.read(1):
                        pass
                    return
                if kind == "status":
                    payload = json.dumps(
                        {"error": {"message": f"fake {value}", "type": "x"}}
                    ).encode()
                    self.send_response(value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Retry-After", "0")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                usage = {
                    "id": "c1",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "fake",
                    "choices": [],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107},
                }
                for item in [*value, usage]:
                    self.wfile.write(f"data: {json.dumps(item)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_endpoint() -> Iterator[FakeEndpoint]:
    endpoint = FakeEndpoint()
    yield endpoint
    endpoint.close()


@pytest.fixture
def quick_task(tmp_path: Path) -> Path:
    """decode-split-norm with a smaller problem and measurement budget (same code and harness)."""
    from support import quick_decode_task

    return quick_decode_task(tmp_path)
