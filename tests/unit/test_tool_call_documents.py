"""Chat documents of replies that call tools: whole, and chunk by chunk (what the official
client's stream assembly sees), with finish_reason `tool_calls` and logprobs kept in order."""

from __future__ import annotations

from typing import Any

import msgspec

from frontend.openai import responses as docs
from frontend.openai.formats import ChatFormat
from frontend.text.generation import Piece
from frontend.text.tool_calls import HERMES, JSON_FORM, ToolCallParser
from shared.protocol import TokenLogprob

HEAD = docs.Head(id="chatcmpl-1", created=1, model="m")
CALL = '{"tool_calls": [{"name": "f", "arguments": {"x": 1}}]}'


def lp(token_id: int) -> TokenLogprob:
    return TokenLogprob(token_id=token_id, logprob=-1.0, top=[])


def wire(document: msgspec.Struct | None) -> Any:
    return None if document is None else msgspec.json.decode(msgspec.json.encode(document))


def test_a_whole_reply_of_calls_has_null_content_and_finishes_with_tool_calls() -> None:
    fmt = ChatFormat(HEAD, lambda i: b"x", False, ToolCallParser(JSON_FORM))
    message = wire(fmt.whole(CALL, "stop", docs.usage(1, 2), []))["choices"][0]
    assert message["finish_reason"] == "tool_calls"
    assert message["message"]["content"] is None
    (call,) = message["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "f", "arguments": '{"x": 1}'}


def test_a_cut_off_reply_finishes_with_length() -> None:
    fmt = ChatFormat(HEAD, lambda i: b"x", False, ToolCallParser(JSON_FORM))
    choice = wire(fmt.whole(CALL[:30], "length", docs.usage(1, 2), []))["choices"][0]
    assert choice["finish_reason"] == "length"


def test_an_answer_without_calls_is_content_and_stop() -> None:
    fmt = ChatFormat(HEAD, lambda i: b"x", False, ToolCallParser(HERMES))
    choice = wire(fmt.whole("Hello.", "stop", docs.usage(1, 2), []))["choices"][0]
    assert (choice["finish_reason"], choice["message"]["content"]) == ("stop", "Hello.")
    assert "tool_calls" not in choice["message"]


def test_chunks_name_a_call_once_then_stream_its_arguments() -> None:
    fmt = ChatFormat(HEAD, lambda i: b"t", True, ToolCallParser(JSON_FORM))
    pieces = [CALL[:10], CALL[10:40], CALL[40:], ""]
    chunks = [
        wire(fmt.chunk(Piece(text, [lp(i)], "stop" if i == 3 else None)))
        for i, text in enumerate(pieces)
    ]
    assert chunks[0] is None  # nothing to show yet: its logprobs wait for the next chunk
    deltas = [d for c in chunks if c for d in c["choices"][0]["delta"].get("tool_calls", [])]
    assert deltas[0] == {
        "index": 0,
        "id": deltas[0]["id"],
        "type": "function",
        "function": {"name": "f", "arguments": ""},
    }
    assert all(set(d) == {"index", "function"} for d in deltas[1:])
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"x": 1}'
    logprobs = [
        e
        for c in chunks
        if c and c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    assert len(logprobs) == 4  # every token's logprob, each exactly once
    last = chunks[-1]["choices"][0]
    assert (last["finish_reason"], last["delta"]) == ("tool_calls", {})
