from __future__ import annotations

import orjson

from proxy.core.openai.sse import StreamTee, answer_of_completion


def ev(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chunk(content: str | None = None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    return ev({"id": "c1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def test_tee_reassembles_split_events_and_strips_our_usage_chunk() -> None:
    usage = ev({"id": "c1", "choices": [], "usage": {"prompt_tokens": 3}})
    stream = chunk("Hel") + chunk("lo") + chunk(finish="stop") + usage + b"data: [DONE]\n\n"
    tee = StreamTee(strip_usage=True)
    out = b"".join(tee.feed(stream[i : i + 7]) for i in range(0, len(stream), 7)) + tee.flush()
    assert tee.text == "Hello" and tee.complete and tee.usage == {"prompt_tokens": 3}
    assert b"usage" not in out and out.endswith(b"data: [DONE]\n\n")
    assert tee.response_id == "c1"


def test_tee_without_done_or_with_tool_calls_is_incomplete() -> None:
    tee = StreamTee()
    tee.feed(chunk("Hi") + chunk(finish="stop"))
    assert not tee.complete
    tee = StreamTee()
    tee.feed(ev({"choices": [{"delta": {"tool_calls": [{"id": "x"}]}, "finish_reason": "stop"}]}) + b"data: [DONE]\n\n")
    assert not tee.complete


def test_answer_of_completion_stores_only_plain_stopped_answers() -> None:
    ok = {"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 1}}
    assert answer_of_completion(ok) == ("x", {"prompt_tokens": 1})
    assert answer_of_completion({"choices": [{"message": {"content": "x"}, "finish_reason": "length"}]})[0] is None
    assert answer_of_completion({"choices": [{"message": {"content": " "}, "finish_reason": "stop"}]})[0] is None
    assert answer_of_completion([])[0] is None


def test_an_answer_longer_than_the_tee_keeps_is_relayed_whole_but_not_kept() -> None:
    tee = StreamTee(max_text_chars=10)
    pieces = [chunk("abcdef"), chunk("ghijkl"), chunk(finish="stop"), b"data: [DONE]\n\n"]
    out = b"".join(tee.feed(p) for p in pieces)
    assert out == b"".join(pieces)  # the client gets every byte
    assert tee.oversized and tee.text == "" and not tee.complete


def test_bytes_that_never_close_an_event_are_relayed_as_they_come_and_not_held() -> None:
    tee = StreamTee(max_event_bytes=1024)
    first = tee.feed(chunk("Hi"))
    assert first == chunk("Hi")
    flood = b"data: " + b"x" * 2000  # no blank line: one event that never ends
    assert tee.feed(flood) == flood and tee.feed(b"yyy") == b"yyy"
    assert tee.malformed and not tee.complete and not tee.done
    assert len(tee._buffer) == 0
    # its end still counts as the end: the relay then adds no error event after the upstream's [DONE]
    assert tee.feed(b"\n\ndata: [DONE]\n\n") == b"\n\ndata: [DONE]\n\n"
    assert tee.done and not tee.complete
