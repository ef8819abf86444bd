from __future__ import annotations

from typing import Any

import orjson

from proxy.core.openai.responses_sse import ResponsesTee


def ev(kind: str, **data: Any) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


def stream(*deltas: str, end: str = "response.completed", **response: Any) -> bytes:
    usage = {"input_tokens": 5, "output_tokens": 2}
    return b"".join(
        [
            ev("response.created", response={"id": "resp_up", "status": "in_progress"}),
            ev("response.output_item.added", output_index=0, item={"type": "message", "content": []}),
            *(ev("response.output_text.delta", delta=d) for d in deltas),
            ev(end, response={"id": "resp_up", "status": end.split(".")[1], "usage": usage, **response}),
        ]
    )


def test_the_tee_relays_every_event_and_keeps_the_answer() -> None:
    data = stream("Par", "is.")
    tee = ResponsesTee()
    out = b"".join(tee.feed(data[i : i + 9]) for i in range(0, len(data), 9)) + tee.flush()
    assert out == data
    assert (tee.text, tee.response_id, tee.finish_reason) == ("Paris.", "resp_up", "stop")
    assert tee.complete and tee.usage == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


def test_a_stream_is_whole_only_once_its_last_event_came() -> None:
    tee = ResponsesTee()
    tee.feed(stream("Paris.")[:-40])
    assert not tee.done and not tee.whole


def test_a_cut_failed_or_tool_answer_is_none_to_keep() -> None:
    cut = ResponsesTee()
    cut.feed(stream("Par", end="response.incomplete", incomplete_details={"reason": "max_output_tokens"}))
    assert cut.cut_at_limit and not cut.complete
    failed = ResponsesTee()
    failed.feed(stream("Par", end="response.failed"))
    assert failed.done and not failed.whole
    errored = ResponsesTee()
    errored.feed(ev("response.created", response={"id": "r"}) + ev("error", code="boom", message="no"))
    assert errored.done and not errored.whole
    tool = ResponsesTee()
    tool.feed(ev("response.output_item.added", item={"type": "function_call"}) + stream())
    assert tool.done and not tool.whole
    refused = ResponsesTee()
    refused.feed(ev("response.refusal.delta", delta="No.") + stream())
    assert not refused.whole
