"""The OpenAI views over random agent runs, shaped as the agent loop emits them: well-formed
(every item added is done, numbered without gaps, exactly one ending), and the text a
client reassembles is the run's."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agent_runs import Run, agent_runs
from agentstream.events import Event
from agentstream.views.frames import as_dict
from agentstream.views.openai import NUMBERS_PER_EVENT, ChatCompletionChunks, ResponseEvents


def responses(events: list[Event]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    view = ResponseEvents.begin("run_1", model="a", created_at=1.0)
    return [as_dict(frame) for event in events for frame in view(event)], view.response


@given(agent_runs())
def test_response_events_are_well_formed(run: Run) -> None:
    frames, response = responses(run.live)
    numbers = [f["sequence_number"] for f in frames]
    assert numbers == sorted(set(numbers))
    assert numbers[0] == 0
    assert [f["type"] for f in frames[:2]] == ["response.created", "response.in_progress"]
    ends = [f for f in frames if f["type"] in ("response.completed", "response.failed")]
    assert ends == ([] if run.paused else [frames[-1]])
    added = [f["item"]["id"] for f in frames if f["type"] == "response.output_item.added"]
    done = [f["item"]["id"] for f in frames if f["type"] == "response.output_item.done"]
    assert added == sorted(set(added), key=added.index)  # each item once
    open_ = set(added) - set(done)
    assert set(done) <= set(added)
    # Paused, only the calls waiting for a decision are open, and each has its request.
    last: Any = run.live[-1]
    assert open_ == ({f"mcp_{i}" for i in last.awaiting} if run.paused else set())
    assert [item["id"] for item in response["output"]] == added
    for item in response["output"]:
        deltas = "".join(
            f["delta"]
            for f in frames
            if f.get("item_id") == item["id"] and f["type"].endswith("text.delta")
        )
        if item["type"] == "message":
            assert item["content"][0]["text"] == deltas
        if item["type"] == "reasoning":
            assert item["summary"][0]["text"] == deltas


@given(agent_runs(), st.booleans())
def test_an_event_s_frames_are_numbered_from_its_seq(run: Run, stored: bool) -> None:
    """So live and stored, where there are no deltas, number an event's frames alike."""
    view = ResponseEvents.begin("run_1", model="a", created_at=1.0)
    events = run.stored if stored else run.live
    for event in events[:-1]:
        for frame in map(as_dict, view(event)):
            assert frame["sequence_number"] // NUMBERS_PER_EVENT == event.seq - 1


@given(agent_runs())
def test_a_response_s_answer_is_the_run_s(run: Run) -> None:
    _, live = responses(run.live)
    _, stored = responses(run.stored)
    messages = [item for item in live["output"] if item["type"] == "message"]
    if run.answer is not None:
        assert live["status"] == "completed"
        if run.answer:
            assert messages[-1]["content"][0]["text"] == run.answer
            assert messages[-1]["phase"] == "final_answer"
    elif run.paused:
        assert live["status"] == "in_progress"
        assert live["output"][-1]["type"] == "mcp_approval_request"
    else:
        assert live["status"] in ("failed", "cancelled")
    # Read back from the store (no deltas, no preamble), a completed response has the same
    # output but for the preambles' messages (and so its items' ids, their places, differ).
    if run.answer is not None:
        final = [item for item in live["output"] if item.get("phase") != "commentary"]
        assert [_without_id(item) for item in stored["output"]] == [
            _without_id(item) for item in final
        ]


def _without_id(item: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in item.items() if name != "id"}


@given(agent_runs())
def test_chat_chunks_reassemble_the_streamed_text(run: Run) -> None:
    view = ChatCompletionChunks("chatcmpl-1", "a", 1, include_usage=True)
    frames = [as_dict(frame) for event in run.live for frame in view(event)]
    assert frames[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    chunks = [f for f in frames if f.get("choices")]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == run.shown
    finishes = [
        c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]
    ]
    errors = [f for f in frames if "error" in f]
    if run.answer is not None:
        assert (finishes, errors) == (["stop"], [])
        assert frames[-1]["choices"] == []
        assert frames[-1]["usage"] == {
            "prompt_tokens": 3,
            "completion_tokens": 4,
            "total_tokens": 7,
        }
    else:
        assert (finishes, len(errors)) == ([], 1)
        assert frames[-1] is errors[0]
        last: Any = run.live[-1]
        code = "approval_required" if run.paused else last.status
        assert errors[0]["error"]["code"] == code
