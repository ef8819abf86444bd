"""A held answer as the Responses API's response object and event stream, checked against the
installed SDK's own types and its stream accumulator; an upstream's response read back."""

from __future__ import annotations

import orjson
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from proxy.core.openai.response_object import HeldResponse, chat_usage, output_text, read_response

REQUEST = {"model": "m", "input": "hi", "instructions": "Be brief.", "temperature": 0.3, "max_output_tokens": 64}
EVENTS = TypeAdapter(ResponseStreamEvent)


def data_of(event: bytes) -> dict[str, object]:
    head, data = event.rstrip(b"\n").split(b"\n")
    parsed = orjson.loads(data.removeprefix(b"data: "))
    assert head == b"event: " + str(parsed["type"]).encode()
    return dict(parsed)


def test_the_json_is_a_completed_response_the_sdk_validates() -> None:
    held = HeldResponse.of(REQUEST, "m", "Paris.")
    response = Response.model_validate(orjson.loads(held.json()))
    assert response.id.startswith("resp_") and response.status == "completed"
    assert response.output_text == "Paris." and response.instructions == "Be brief."
    assert (response.temperature, response.max_output_tokens) == (0.3, 64)
    assert response.usage is not None and response.usage.total_tokens == 0
    assert HeldResponse.of(REQUEST, "m", "x").response_id != held.response_id


def test_the_events_validate_and_accumulate_into_the_same_response() -> None:
    text = "The capital of France is Paris, on the Seine."
    held = HeldResponse.of(REQUEST, "m", text)
    state: ResponseStreamState[object] = ResponseStreamState(input_tools=omit, text_format=omit)
    raw = [data_of(e) for e in held.events(piece_chars=10)]
    events = [EVENTS.validate_python(d) for d in raw]
    for event in events:
        state.handle_event(event)  # type: ignore[arg-type]
    assert [d["sequence_number"] for d in raw] == list(range(len(raw)))
    assert "".join(str(d["delta"]) for d in raw if d["type"] == "response.output_text.delta") == text
    final = state._completed_response
    assert final is not None and final.output_text == text and final.id == held.response_id


def test_an_answer_cut_at_the_limit_is_incomplete() -> None:
    held = HeldResponse.of(REQUEST, "m", "Par", cut=True)
    response = Response.model_validate(orjson.loads(held.json()))
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert data_of(held.events()[-1])["type"] == "response.incomplete"


def message(*parts: dict[str, object]) -> dict[str, object]:
    return {"type": "message", "role": "assistant", "content": list(parts)}


def test_an_upstream_response_read_in_chats_terms() -> None:
    body = {
        "id": "resp_up",
        "status": "completed",
        "output": [{"type": "reasoning", "summary": []}, message({"type": "output_text", "text": "Paris."})],
        "usage": {"input_tokens": 12, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 8}},
    }
    read = read_response(body)
    assert (read.text, read.finish_reason, read.response_id) == ("Paris.", "stop", "resp_up")
    assert read.usage == {
        "prompt_tokens": 12,
        "completion_tokens": 3,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 8},
    }
    cut = read_response({**body, "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}})
    assert cut.finish_reason == "length"
    filtered = read_response({**body, "status": "incomplete", "incomplete_details": {"reason": "content_filter"}})
    assert filtered.finish_reason is None
    assert read_response([1]).text is None and chat_usage(None) == {}


def test_output_other_than_text_is_no_answer() -> None:
    assert output_text([{"type": "function_call", "name": "f", "arguments": "{}"}]) is None
    assert output_text([message({"type": "refusal", "refusal": "No."})]) is None
    assert output_text([]) is None
    assert (
        output_text([message({"type": "output_text", "text": "a"}), message({"type": "output_text", "text": "b"})])
        == "ab"
    )
