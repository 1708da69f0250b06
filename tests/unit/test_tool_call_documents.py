"""Chat documents of replies that call tools: whole, and chunk by chunk (what the official
client's stream assembly sees), with finish_reason `tool_calls` and logprobs kept in order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from frontend.openai import responses as docs
from frontend.openai.formats import ChatFormat, ChoiceOutput
from frontend.text.generation import Piece
from frontend.text.tool_calls import HERMES, JSON_FORM, ToolCallParser, ToolSyntax
from shared.protocol import TokenLogprob

HEAD = docs.Head(id="chatcmpl-1", created=1, model="m")
CALL = '{"tool_calls": [{"name": "f", "arguments": {"x": 1}}]}'


def lp(token_id: int) -> TokenLogprob:
    return TokenLogprob(token_id=token_id, logprob=-1.0, top=[])


def wire(document: msgspec.Struct | None) -> Any:
    return None if document is None else msgspec.json.decode(msgspec.json.encode(document))


def tools(syntax: ToolSyntax) -> Callable[[], ToolCallParser]:
    return lambda: ToolCallParser(syntax)


def whole(fmt: ChatFormat, *replies: tuple[str, str]) -> Any:
    outputs = [ChoiceOutput(text, finish, [], None, None) for text, finish in replies]
    return wire(fmt.whole(outputs, docs.usage(1, 2)))


def test_a_whole_reply_of_calls_has_null_content_and_finishes_with_tool_calls() -> None:
    fmt = ChatFormat(HEAD, lambda i: b"x", None, tools(JSON_FORM))
    message = whole(fmt, (CALL, "stop"))["choices"][0]
    assert message["finish_reason"] == "tool_calls"
    assert message["message"]["content"] is None
    (call,) = message["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "f", "arguments": '{"x": 1}'}


def test_a_cut_off_reply_finishes_with_length() -> None:
    fmt = ChatFormat(HEAD, lambda i: b"x", None, tools(JSON_FORM))
    choice = whole(fmt, (CALL[:30], "length"))["choices"][0]
    assert choice["finish_reason"] == "length"


def test_an_answer_without_calls_is_content_and_stop() -> None:
    fmt = ChatFormat(HEAD, lambda i: b"x", None, tools(HERMES))
    choice = whole(fmt, ("Hello.", "stop"))["choices"][0]
    assert (choice["finish_reason"], choice["message"]["content"]) == ("stop", "Hello.")
    assert "tool_calls" not in choice["message"]


def test_chunks_name_a_call_once_then_stream_its_arguments() -> None:
    fmt = ChatFormat(HEAD, lambda i: b"t", 0, tools(JSON_FORM))
    pieces = [CALL[:10], CALL[10:40], CALL[40:], ""]
    chunks = [
        wire(fmt.chunk(0, Piece(text, [lp(i)], "stop" if i == 3 else None)))
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


def test_each_choice_has_its_own_calls() -> None:
    """n > 1: one choice calls, the other answers; whole and streamed (interleaved)."""
    fmt = ChatFormat(HEAD, lambda i: b"t", 0, tools(JSON_FORM))
    answer = '{"content": "Hi."}'
    first, second = whole(fmt, (CALL, "stop"), (answer, "stop"))["choices"]
    assert (first["index"], first["finish_reason"]) == (0, "tool_calls")
    assert (second["index"], second["finish_reason"]) == (1, "stop")
    assert second["message"] == {"role": "assistant", "content": "Hi."}
    chunks = []
    for i in range(2):
        for index, text in ((0, CALL), (1, answer)):
            piece = Piece(text[: len(text) // 2] if i == 0 else text[len(text) // 2 :], [lp(i)],
                          "stop" if i == 1 else None)  # fmt: skip
            chunk = wire(fmt.chunk(index, piece))
            chunks += [chunk["choices"][0]] if chunk else []
    by_index = {i: [c for c in chunks if c["index"] == i] for i in (0, 1)}
    assert by_index[0][-1]["finish_reason"] == "tool_calls"
    assert by_index[1][-1]["finish_reason"] == "stop"
    assert "".join(c["delta"].get("content") or "" for c in by_index[1]) == "Hi."
    assert not any("tool_calls" in c["delta"] for c in by_index[1])
    for index in (0, 1):  # each choice's logprobs once, in its own chunks
        entries = [e for c in by_index[index] if c["logprobs"] for e in c["logprobs"]["content"]]
        assert len(entries) == 2
