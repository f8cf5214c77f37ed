"""The workflow engine: event order, concurrency, errors and error edges, condition routing,
references, agent and orchestration blocks, cancellation."""

from __future__ import annotations

import functools
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, cast

import anyio
import anyio.lowlevel
import pytest

from agentstream.agents import AgentSpec
from agentstream.errors import NotFound
from agentstream.events import (
    BaseEvent,
    Event,
    RunCompleted,
    RunFailed,
    RunStarted,
    TextDelta,
    ToolCall,
    Usage,
)
from agentstream.providers.base import (
    ModelPart,
    ModelRequest,
    ReasoningPart,
    TextPart,
    ToolCallArgsPart,
    ToolCallEndPart,
    ToolCallStartPart,
    TurnEndPart,
    UsagePart,
)
from agentstream.providers.catalog import load_catalog
from agentstream.providers.registry import ModelRegistry
from agentstream.providers.scripted import ScriptedModel
from agentstream.runtime.blocks import RuntimeAgentRunner
from agentstream.runtime.builtin_tools import BUILTIN_TOOLS
from agentstream.runtime.context import RunContext
from agentstream.runtime.executions import terminal
from agentstream.runtime.tools import Tool, ToolRegistry
from agentstream.workflows import (
    AgentEvents,
    ExecutionResult,
    Workflow,
    WorkflowEngine,
    WorkflowInvalid,
    parse_workflow,
)
from agentstream.workflows.engine import _BlockScope
from agentstream.workflows.expressions import Expression

pytestmark = pytest.mark.anyio

TERMINAL = {"run_completed", "run_failed"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Recorder:
    """An event sink that keeps everything, and can wake a test when an event arrives."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.batches: list[list[str]] = []
        """The types of the events of each hand-over, in order: what went in one write."""
        self._watchers: list[tuple[Callable[[Event], bool], anyio.Event]] = []

    async def __call__(self, events: Sequence[BaseEvent]) -> None:
        self.batches.append([cast(Event, event).type for event in events])
        for event in events:
            self.events.append(cast(Event, event))  # the runtime makes only the union's events
            for matches, seen in self._watchers:
                if matches(self.events[-1]):
                    seen.set()

    def watch(self, matches: Callable[[Event], bool]) -> anyio.Event:
        seen = anyio.Event()
        self._watchers.append((matches, seen))
        return seen

    def types(self, block_id: str | None = None) -> list[str]:
        return [
            e.type
            for e in self.events
            if block_id is None or getattr(e, "block_id", None) == block_id
        ]

    def of(self, kind: str) -> list[Any]:
        return [e for e in self.events if e.type == kind]


def workflow(
    blocks: list[dict[str, Any]], edges: Iterable[tuple[str, str] | dict[str, Any]]
) -> Workflow:
    """A workflow from blocks and edges; an edge is ``(from, to)`` or a full edge object."""
    return parse_workflow(
        {
            "id": "test",
            "blocks": [{"id": "start", "type": "start"}, *blocks],
            "edges": [e if isinstance(e, dict) else {"from": e[0], "to": e[1]} for e in edges],
        }
    )


def emitter(sink: Callable[[Sequence[BaseEvent]], Awaitable[None]]) -> RunContext:
    """An execution's emitter whose sink is ``sink``."""
    return RunContext("wfx_test", sink=sink)


async def execute(
    flow: Workflow, inputs: Any = None, **engine: Any
) -> tuple[Recorder, ExecutionResult]:
    """Run the execution, then end it as the server does, with the terminal event that
    says how (``runtime.executions.terminal``)."""
    recorder = Recorder()
    ctx = emitter(recorder)
    with anyio.fail_after(10):
        result = await WorkflowEngine(**engine).execution(flow, ctx).run(inputs)
    await recorder([terminal(ctx, result)])
    return recorder, result


def assert_well_formed(recorder: Recorder) -> None:
    """Seqs 1, 2, 3...; ``run_started`` first and exactly one terminal event, last."""
    assert [e.seq for e in recorder.events] == list(range(1, len(recorder.events) + 1))
    types = recorder.types()
    assert types[0] == "run_started"
    assert [t for t in types if t in TERMINAL] == [types[-1]]


class TakingTurns:
    """An agent runner whose agents write in strict alternation, each waiting for the
    other's token before its next: their events can only interleave if they run at once."""

    def __init__(self, *agents: str, tokens: int = 3) -> None:
        self.agents = agents
        self.tokens = tokens
        self.turn = 0
        self.moved = anyio.Event()

    async def run_agent(
        self, agent: str | AgentSpec, message: str, *, reasoning: bool | None, events: AgentEvents
    ) -> str:
        assert isinstance(agent, str)
        for i in range(self.tokens):
            while self.agents[self.turn % len(self.agents)] != agent:
                await self.moved.wait()
            await events([TextDelta(run_id="r", seq=i + 1, ts=0.0, step=1, delta=f"{agent}{i} ")])
            self.turn += 1
            self.moved.set()
            self.moved = anyio.Event()
        return f"{agent} says {message}"


# --- order and concurrency ------------------------------------------------------------------


async def test_diamond_runs_its_parallel_pair_concurrently_and_completes_last() -> None:
    flow = workflow(
        [
            {"id": "left", "type": "agent", "agent": "left", "input": "<start.input>"},
            {"id": "right", "type": "agent", "agent": "right", "input": "<start.input>"},
            {"id": "join", "type": "template", "template": "<left.content> | <right.content>"},
            {"id": "out", "type": "response", "output": "<join.text>"},
        ],
        [
            ("start", "left"),
            ("start", "right"),
            ("left", "join"),
            ("right", "join"),
            ("join", "out"),
        ],
    )
    recorder, result = await execute(flow, "hi", agents=TakingTurns("left", "right"))

    assert_well_formed(recorder)
    deltas = [(e.block_id, e.delta) for e in recorder.of("text_delta")]
    assert deltas == [
        ("left", "left0 "),
        ("right", "right0 "),
        ("left", "left1 "),
        ("right", "right1 "),
        ("left", "left2 "),
        ("right", "right2 "),
    ]
    assert recorder.types("left") == [
        "block_started",
        *["text_delta"] * 3,
        "block_output",
        "block_completed",
    ]
    seq = {(e.type, e.block_id): e.seq for e in recorder.events if hasattr(e, "block_id")}
    assert seq["block_started", "join"] > seq["block_completed", "left"]
    assert seq["block_started", "join"] > seq["block_completed", "right"]
    assert recorder.types()[-1] == "run_completed"
    assert result == ExecutionResult("completed", result="left says hi | right says hi")
    last = recorder.events[-1]
    assert isinstance(last, RunCompleted)
    assert last.result == "left says hi | right says hi"


async def test_a_chain_runs_in_order_with_outputs_before_completion() -> None:
    flow = workflow(
        [
            {"id": "a", "type": "template", "template": "a(<start.input>)"},
            {"id": "b", "type": "template", "template": "b(<a.text>)"},
        ],
        [("start", "a"), ("a", "b")],
    )
    recorder, result = await execute(flow, "x")

    assert recorder.types() == [
        "run_started",
        *["block_started", "block_output", "block_completed"] * 3,
        "run_completed",
    ]
    assert [e.block_id for e in recorder.of("block_started")] == ["start", "a", "b"]
    assert recorder.of("block_output")[2].output == {"text": "b(a(x))"}
    assert result.result is None  # no response block


async def test_a_slow_sink_still_receives_events_in_seq_order() -> None:
    received: list[int] = []

    async def slow_sink(events: Sequence[BaseEvent]) -> None:
        await anyio.sleep(0.001 * (events[0].seq % 3))
        received.extend(event.seq for event in events)

    flow = workflow(
        [{"id": f"t{i}", "type": "template", "template": "<start.input>"} for i in range(5)],
        [("start", f"t{i}") for i in range(5)],
    )
    await WorkflowEngine().execution(flow, emitter(slow_sink)).run("x")

    assert received == list(range(1, len(received) + 1))
    assert len(received) == 1 + 3 * 6


# --- errors --------------------------------------------------------------------------------


def fail(message: str) -> None:
    raise ValueError(message)


async def test_a_failing_block_short_circuits_the_workflow() -> None:
    blocked = anyio.Event()

    async def wait_forever() -> str:
        blocked.set()
        await anyio.sleep_forever()
        raise AssertionError("never")

    flow = workflow(
        [
            {"id": "slow", "type": "function", "function": "wait_forever"},
            {"id": "bad", "type": "function", "function": "fail", "args": {"message": "boom"}},
            {"id": "after", "type": "template", "template": "<bad.result>"},
        ],
        [("start", "slow"), ("start", "bad"), ("bad", "after")],
    )
    recorder, result = await execute(flow, functions={"fail": fail, "wait_forever": wait_forever})

    assert_well_formed(recorder)
    assert blocked.is_set()
    error = next(e for e in recorder.of("block_error"))
    assert (error.block_id, error.handled) == ("bad", False)
    assert error.error == "fail raised ValueError: boom"
    assert recorder.types("slow") == ["block_started"]  # cancelled, never completed
    assert recorder.types("after") == []
    last = recorder.events[-1]
    assert isinstance(last, RunFailed)
    assert (last.type, last.status) == ("run_failed", "error")
    assert (last.failed_block, last.message) == (
        "bad",
        "Block 'bad' failed: fail raised ValueError: boom",
    )
    assert result.status == "error"


async def test_an_error_edge_runs_the_handler_with_the_error_and_skips_the_success_path() -> None:
    flow = workflow(
        [
            {"id": "bad", "type": "function", "function": "fail", "args": {"message": "boom"}},
            {"id": "on_success", "type": "template", "template": "fine: <bad.result>"},
            {"id": "then", "type": "template", "template": "<on_success.text>"},
            {"id": "handler", "type": "template", "template": "recovered from: <bad.error>"},
            {"id": "out", "type": "response", "output": {"text": "<handler.text>"}},
        ],
        [
            ("start", "bad"),
            ("bad", "on_success"),
            ("on_success", "then"),
            {"from": "bad", "to": "handler", "on": "error"},
            ("handler", "out"),
        ],
    )
    recorder, result = await execute(flow, functions={"fail": fail})

    assert_well_formed(recorder)
    assert recorder.types("bad") == ["block_started", "block_error"]
    assert recorder.of("block_error")[0].handled is True
    assert recorder.types("on_success") == ["block_skipped"]
    assert recorder.types("then") == ["block_skipped"]
    assert recorder.types("handler") == ["block_started", "block_output", "block_completed"]
    assert result == ExecutionResult(
        "completed", result={"text": "recovered from: fail raised ValueError: boom"}
    )


async def test_a_block_that_succeeds_does_not_take_its_error_edge() -> None:
    flow = workflow(
        [
            {"id": "ok", "type": "function", "expression": "1 + 1"},
            {"id": "handler", "type": "template", "template": "<ok.error>"},
            {"id": "next", "type": "template", "template": "<ok.result>, error: <ok.error>"},
        ],
        [("start", "ok"), {"from": "ok", "to": "handler", "on": "error"}, ("ok", "next")],
    )
    recorder, _ = await execute(flow)

    assert recorder.types("handler") == ["block_skipped"]
    assert recorder.of("block_output")[-1].output == {"text": "2, error: "}


async def test_an_unexpected_exception_is_reported_without_its_details() -> None:
    class Broken:
        async def run_agent(self, *args: Any, **kwargs: Any) -> str:
            raise KeyError("secret internals")

    flow = workflow([{"id": "a", "type": "agent", "agent": "x", "input": "hi"}], [("start", "a")])
    recorder, result = await execute(flow, agents=Broken())

    error = recorder.of("block_error")[0].error
    assert error.startswith("Internal error")
    assert "secret" not in error
    assert result.status == "error"


# --- conditions ----------------------------------------------------------------------------


def routed() -> Workflow:
    return workflow(
        [
            {
                "id": "route",
                "type": "condition",
                "branches": [
                    {"name": "big", "when": "start.input.n > 10"},
                    {"name": "small", "when": "start.input.n > 0"},
                ],
            },
            {"id": "big", "type": "template", "template": "big"},
            {"id": "big_next", "type": "template", "template": "<big.text>!"},
            {"id": "small", "type": "template", "template": "small"},
            {"id": "small_next", "type": "template", "template": "<small.text>!"},
            {
                "id": "out",
                "type": "response",
                "output": {"big": "<big_next.text>", "small": "<small_next.text>"},
            },
        ],
        [
            ("start", "route"),
            {"from": "route", "to": "big", "branch": "big"},
            {"from": "route", "to": "small", "branch": "small"},
            ("big", "big_next"),
            ("small", "small_next"),
            ("big_next", "out"),
            ("small_next", "out"),
        ],
    )


async def test_a_condition_runs_the_taken_branch_and_skips_the_other_with_its_descendants() -> None:
    recorder, result = await execute(routed(), {"n": 3})

    assert_well_formed(recorder)
    assert recorder.of("block_output")[1].output == {"branch": "small"}
    assert recorder.types("big") == ["block_skipped"]
    assert recorder.types("big_next") == ["block_skipped"]
    assert recorder.types("small_next") == ["block_started", "block_output", "block_completed"]
    assert result.result == {"big": None, "small": "small!"}

    recorder, result = await execute(routed(), {"n": 30})
    assert recorder.types("small") == ["block_skipped"]
    assert result.result == {"big": "big!", "small": None}


async def test_a_condition_with_no_true_branch_skips_everything_after_it() -> None:
    recorder, result = await execute(routed(), {"n": -1})

    assert recorder.of("block_output")[1].output == {"branch": None}
    skipped = [e.block_id for e in recorder.of("block_skipped")]
    assert sorted(skipped) == ["big", "big_next", "out", "small", "small_next"]
    assert result == ExecutionResult("completed", result=None)


async def test_a_failing_condition_expression_is_a_block_error() -> None:
    recorder, result = await execute(routed(), {"n": "three"})

    assert "'>' not supported" in recorder.of("block_error")[0].error
    assert result.status == "error"


@pytest.mark.parametrize(
    "expression",
    [  # unbounded, each would take a minute and gigabytes, stalling every stream meanwhile
        "len(str([[0] * 1000000] * 1000))",
        "sorted(['a' * 1000000] * 1000000) and 1",
        "len(sum([[0] * 1000000] * 100, []))",
    ],
)
async def test_a_runaway_expression_is_a_block_error(expression: str) -> None:
    flow = workflow([{"id": "f", "type": "function", "expression": expression}], [("start", "f")])
    recorder, result = await execute(flow)

    assert "larger than 1,000,000 items" in recorder.of("block_error")[0].error
    assert result.status == "error"


async def test_expressions_are_evaluated_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Other tasks (every other stream) keep running while an expression is evaluated: here
    the evaluation waits for the loop to run another task, which it could not do if it held
    the loop."""
    loop_ran = threading.Event()
    evaluate = Expression.evaluate

    def waiting_evaluate(self: Expression, outputs: Any) -> Any:
        assert loop_ran.wait(timeout=10), "the event loop was blocked during the evaluation"
        return evaluate(self, outputs)

    monkeypatch.setattr(Expression, "evaluate", waiting_evaluate)

    async def other_stream() -> None:
        await anyio.sleep(0.05)
        loop_ran.set()

    flow = workflow([{"id": "f", "type": "function", "expression": "1 + 1"}], [("start", "f")])
    async with anyio.create_task_group() as group:
        group.start_soon(other_stream)
        recorder, result = await execute(flow)
    assert result.status == "completed"
    (output,) = [e.output for e in recorder.of("block_output") if e.block_id == "f"]
    assert output == {"result": 2}


# --- references ----------------------------------------------------------------------------


async def test_references_resolve_nested_fields_list_items_and_whole_values() -> None:
    flow = workflow(
        [
            {"id": "greet", "type": "template", "template": "Hi <start.input.user.name>"},
            {"id": "pick", "type": "template", "template": "<start.input.items.1>"},
            {
                "id": "out",
                "type": "response",
                "output": {
                    "greeting": "<greet.text>",
                    "item": "<pick.text>",
                    "user": "<start.input.user>",
                    "inline": "user=<start.input.user>",
                },
            },
        ],
        [("start", "greet"), ("start", "pick"), ("greet", "out"), ("pick", "out")],
    )
    inputs = {"user": {"name": "Ada"}, "items": ["a", "b"]}
    _, result = await execute(flow, inputs)

    assert result.result == {
        "greeting": "Hi Ada",
        "item": "b",
        "user": {"name": "Ada"},
        "inline": 'user={"name": "Ada"}',
    }


async def test_a_reference_into_data_of_another_shape_fails_the_block_naming_it() -> None:
    flow = workflow(
        [{"id": "greet", "type": "template", "template": "Hi <start.input.user.name>"}],
        [("start", "greet")],
    )
    recorder, result = await execute(flow, {"user": "Ada"})

    assert recorder.of("block_error")[0].error == (
        "<start.input.user.name>: start.input.user has no field 'name' (it is a str)"
    )
    assert result.status == "error"


async def test_a_reference_to_a_block_that_is_not_upstream_is_refused() -> None:
    with pytest.raises(WorkflowInvalid) as caught:
        workflow(
            [
                {"id": "a", "type": "template", "template": "<b.text>"},
                {"id": "b", "type": "template", "template": "b"},
            ],
            [("start", "a"), ("start", "b")],
        )
    assert [i.as_dict() for i in caught.value.issues] == [
        {"block_id": "a", "field": "template", "message": "'b.text': 'b' is not upstream of 'a'"}
    ]


# --- function blocks ------------------------------------------------------------------------


async def test_function_blocks_call_registered_functions_sync_and_async() -> None:
    async def add(a: int, b: int) -> int:
        return a + b

    def shout(text: str) -> str:
        return text.upper()

    flow = workflow(
        [
            {"id": "sum", "type": "function", "function": "add", "args": {"a": 2, "b": 3}},
            {
                "id": "loud",
                "type": "function",
                "function": "shout",
                "args": {"text": "<start.input>"},
            },
            {"id": "calc", "type": "function", "expression": "sum.result * 10 + len(loud.result)"},
            {"id": "out", "type": "response", "output": "<calc.result>"},
        ],
        [("start", "sum"), ("start", "loud"), ("sum", "calc"), ("loud", "calc"), ("calc", "out")],
    )
    _, result = await execute(flow, "hey", functions={"add": add, "shout": shout})

    assert result.result == 53


async def test_a_workflow_calling_an_unregistered_function_cannot_start() -> None:
    flow = workflow([{"id": "f", "type": "function", "function": "nope"}], [("start", "f")])

    with pytest.raises(WorkflowInvalid, match="no function 'nope'"):
        WorkflowEngine(functions={"yes": print}).execution(flow, emitter(Recorder()))


# --- agent and orchestration blocks ---------------------------------------------------------


def tool_then_answer(request: ModelRequest) -> list[ModelPart]:
    if request.messages[-1].role == "tool":
        return [
            ReasoningPart("2+2 is 4. "),
            TextPart("The answer "),
            TextPart("is 4."),
            UsagePart(Usage(input_tokens=5, output_tokens=3)),
            TurnEndPart("end_turn"),
        ]
    return [
        TextPart("Let me compute."),
        ToolCallStartPart("call_1", "calculator"),
        ToolCallArgsPart("call_1", '{"expression": "2+2"}'),
        ToolCallEndPart("call_1"),
        TurnEndPart("tool_calls"),
    ]


def agent_runner(*models: ScriptedModel, tools: Iterable[Tool] = ()) -> RuntimeAgentRunner:
    specs = {
        "math": AgentSpec(id="math", model="scripted-math", tools=["calculator"], reasoning=True),
        "left": AgentSpec(id="left", model="scripted-left", tools=["wait"]),
        "right": AgentSpec(id="right", model="scripted-right"),
        "boss": AgentSpec(id="boss", delegates=["left"]),
        "reader": AgentSpec(id="reader", knowledge_bases=["docs"]),
        "tinkerer": AgentSpec(id="tinkerer", tools=["soldering_iron"]),
    }

    async def find(agent_id: str) -> AgentSpec:
        if agent_id not in specs:
            raise NotFound(f"No agent {agent_id!r}")
        return specs[agent_id]

    return RuntimeAgentRunner(
        models=ModelRegistry(load_catalog(), custom=models),
        tools=ToolRegistry([*BUILTIN_TOOLS, *tools]),
        agents=find,
    )


async def ask_math(
    turns: Callable[[ModelRequest], Iterable[ModelPart]], question: str
) -> tuple[Recorder, ExecutionResult]:
    """The ``math`` agent on a scripted model, in a block whose answer the workflow returns."""
    flow = workflow(
        [
            {"id": "ask", "type": "agent", "agent": "math", "input": "What is <start.input>?"},
            {"id": "out", "type": "response", "output": "<ask.content>"},
        ],
        [("start", "ask"), ("ask", "out")],
    )
    model = ScriptedModel("scripted-math", turns)
    return await execute(flow, question, agents=agent_runner(model))


async def test_an_agent_block_forwards_tokens_resets_reasoning_and_tool_lifecycle() -> None:
    recorder, result = await ask_math(tool_then_answer, "2+2")

    assert_well_formed(recorder)
    scoped = [e for e in recorder.events if getattr(e, "block_id", None) == "ask"]
    summary = [
        (
            e.type,
            getattr(e, "step", None),
            getattr(e, "delta", None) or getattr(e, "text", None),
        )
        for e in scoped
    ]
    assert summary == [
        ("block_started", None, None),
        ("text_delta", 1, "Let me compute."),
        ("text_retracted", 1, "Let me compute."),
        ("tool_call", 1, None),
        ("tool_result", 1, None),
        ("reasoning_delta", 2, "2+2 is 4. "),
        ("reasoning", 2, "2+2 is 4. "),
        ("text_delta", 2, "The answer "),
        ("text_delta", 2, "is 4."),
        ("text", 2, "The answer is 4."),
        ("block_output", None, None),
        ("block_completed", None, None),
    ]
    (start,) = recorder.of("tool_call")
    (end,) = recorder.of("tool_result")
    assert (start.call_id, start.tool_name, start.arguments) == (
        "ask:call_1",
        "calculator",
        {"expression": "2+2"},
    ), "the model's id, scoped to its block"
    assert (end.call_id, end.status, end.result) == ("ask:call_1", "success", 4)
    assert result.result == "The answer is 4."
    assert not any(type(e).persisted for e in recorder.events if "delta" in e.type)


def three_calls_then_answer(request: ModelRequest) -> list[ModelPart]:
    if request.messages[-1].role == "tool":
        return [TextPart("6."), TurnEndPart("end_turn")]
    calls: list[ModelPart] = []
    for call_id in ("c0", "c1", "c2"):
        calls += [
            ToolCallStartPart(call_id, "calculator"),
            ToolCallArgsPart(call_id, '{"expression": "1+1"}'),
            ToolCallEndPart(call_id),
        ]
    return [*calls, TurnEndPart("tool_calls")]


async def test_what_an_agent_block_emits_at_once_reaches_the_execution_at_once() -> None:
    """An agent's step hands over its calls together, and the block its output with its
    completion: the execution's own sink writes each group in one write, not one each."""
    recorder, result = await ask_math(three_calls_then_answer, "1+1, three times")

    assert recorder.batches == [
        ["run_started"],
        ["block_started"],  # start
        ["block_output", "block_completed"],
        ["block_started"],  # ask
        ["tool_call", "tool_call", "tool_call"],
        ["tool_result"],
        ["tool_result"],
        ["tool_result"],
        ["text_delta"],
        ["text"],  # with the agent's step_completed, which the block does not carry
        ["block_output", "block_completed"],
        ["block_started"],  # out
        ["block_output", "block_completed"],
        ["run_completed"],
    ]
    assert result.result == "6."


def tool_call(call_id: str) -> ToolCall:
    return ToolCall(
        run_id="wfa_1", seq=1, ts=0.0, step=1, call_id=call_id, tool_name="t", arguments={}
    )


async def test_a_blocks_calls_whose_hand_over_was_cancelled_are_not_settled_later() -> None:
    """A block cancelled while its calls wait for the execution's turn (a sibling block
    failed): they never reached a viewer, so no cancelled result may settle them after."""
    delivered = anyio.Event()
    kept: list[str] = []

    async def sink(events: Sequence[BaseEvent]) -> None:
        if isinstance(events[0], RunStarted):
            await delivered.wait()  # slow: the execution's turn is taken meanwhile
        kept.extend(type(event).__name__ for event in events)

    ctx = emitter(sink)
    scope = _BlockScope(ctx, "b")
    async with anyio.create_task_group() as execution:
        execution.start_soon(functools.partial(ctx.emit, RunStarted, workflow_id="w"))
        await anyio.wait_all_tasks_blocked()
        async with anyio.create_task_group() as block:
            block.start_soon(scope, [tool_call("c0"), tool_call("c1")])
            await anyio.wait_all_tasks_blocked()
            block.cancel_scope.cancel()
        delivered.set()
    await scope.cancel_open_tools()
    assert kept == ["RunStarted"]


async def test_events_forwarded_into_a_sink_that_failed_give_their_seqs_back() -> None:
    failing = [True]

    async def sink(events: Sequence[BaseEvent]) -> None:
        if failing.pop():
            raise RuntimeError("the store is gone")
        received.extend(events)

    received: list[BaseEvent] = []
    ctx = emitter(sink)
    with pytest.raises(RuntimeError):
        await ctx.forward([tool_call("c0"), tool_call("c1")], block_id="b")
    failing.append(False)
    await ctx.forward([tool_call("c2")], block_id="b")
    assert [(event.seq, event.block_id) for event in received] == [(1, "b")]


async def test_an_agent_block_defined_inline_runs_on_its_own_spec() -> None:
    model = ScriptedModel(
        "scripted-inline", lambda _: [TextPart("inline!"), TurnEndPart("end_turn")]
    )
    flow = workflow(
        [
            {
                "id": "a",
                "type": "agent",
                "agent": {"id": "inline", "model": "scripted-inline"},
                "input": "<start.input>",
            }
        ],
        [("start", "a")],
    )
    recorder, _ = await execute(flow, "go", agents=agent_runner(model))

    assert recorder.of("block_output")[-1].output == {"content": "inline!"}


async def test_an_unknown_agent_fails_its_block_with_the_lookup_error() -> None:
    flow = workflow(
        [{"id": "a", "type": "agent", "agent": "ghost", "input": "x"}], [("start", "a")]
    )
    recorder, _ = await execute(flow, agents=agent_runner())

    assert recorder.of("block_error")[0].error == "No agent 'ghost'"


@pytest.mark.parametrize(
    ("agent", "error"),
    [
        (
            "boss",
            "Agent 'boss' delegates to other agents, which an agent block cannot do: "
            "use an orchestration block",
        ),
        ("reader", "Agent 'reader' searches knowledge bases, which agent blocks cannot do yet"),
        ("tinkerer", "Agent 'tinkerer' cannot run here: Unknown tool 'soldering_iron'"),
    ],
)
async def test_an_agent_needing_tools_an_agent_block_lacks_is_refused_not_crippled(
    agent: str, error: str
) -> None:
    flow = workflow([{"id": "a", "type": "agent", "agent": agent, "input": "x"}], [("start", "a")])
    recorder, result = await execute(flow, agents=agent_runner())

    assert recorder.of("block_error")[0].error.startswith(error)
    assert result.status == "error"


async def test_orchestration_blocks_run_through_their_runner_and_forward_its_text() -> None:
    started_for: list[str] = []

    class Orchestrations:
        async def run_orchestration(
            self, orchestration: str, message: str, *, events: AgentEvents, execution_id: str
        ) -> str:
            started_for.append(execution_id)
            await events([TextDelta(run_id="o", seq=1, ts=0.0, step=1, delta="thinking aloud")])
            return f"{orchestration} did {message}"

    flow = workflow(
        [
            {
                "id": "team",
                "type": "orchestration",
                "orchestration": "crew",
                "input": "<start.input>",
            }
        ],
        [("start", "team")],
    )
    recorder, _ = await execute(flow, "the job", orchestrations=Orchestrations())
    assert [(e.block_id, e.delta) for e in recorder.of("text_delta")] == [
        ("team", "thinking aloud")
    ]
    assert recorder.of("block_output")[-1].output == {"content": "crew did the job"}
    assert started_for == [recorder.of("run_started")[0].run_id], "the coordinator's parent"

    recorder, _ = await execute(flow, "the job")
    assert "no runner is set up" in recorder.of("block_error")[0].error


async def test_a_run_context_hands_events_to_its_sink_in_seq_order() -> None:
    """Agent blocks run on a context whose sink is the block's: concurrent emitters (parallel
    tool calls) must still reach it in order, however long the sink takes."""
    seen: list[int] = []

    async def sink(events: Sequence[BaseEvent]) -> None:
        if events[0].seq == 1:
            await anyio.sleep(0.01)  # the first event is slow to deliver
        seen.extend(event.seq for event in events)

    ctx = RunContext("run", sink=sink)
    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(functools.partial(ctx.emit, TextDelta, step=1, delta="x"))
    assert seen == [1, 2, 3]


# --- cancellation --------------------------------------------------------------------------


async def wait() -> str:
    """Wait, a long time."""
    await anyio.sleep(30)
    return "waited"


def call_wait(request: ModelRequest) -> list[ModelPart]:
    return [
        ToolCallStartPart("call_w", "wait"),
        ToolCallArgsPart("call_w", "{}"),
        ToolCallEndPart("call_w"),
        TurnEndPart("tool_calls"),
    ]


def chatter(request: ModelRequest) -> Iterable[ModelPart]:
    for i in range(1000):
        yield TextPart(f"word{i} ")
    yield TurnEndPart("end_turn")


def cancellable() -> tuple[Workflow, ScriptedModel, ScriptedModel, RuntimeAgentRunner]:
    left = ScriptedModel("scripted-left", call_wait)
    right = ScriptedModel("scripted-right", chatter, delay=0.01)
    flow = workflow(
        [
            {"id": "left", "type": "agent", "agent": "left", "input": "<start.input>"},
            {"id": "right", "type": "agent", "agent": "right", "input": "<start.input>"},
            {"id": "join", "type": "template", "template": "<left.content><right.content>"},
        ],
        [("start", "left"), ("start", "right"), ("left", "join"), ("right", "join")],
    )
    return flow, left, right, agent_runner(left, right, tools=[Tool(wait)])


async def test_cancelling_an_execution_stops_every_running_block_and_propagates() -> None:
    """The supervisor stops a run by cancelling it: every running block stops, a tool call
    in flight settles as cancelled, and the cancel propagates (the supervisor then ends the
    run with its terminal event)."""
    flow, left, right, runner = cancellable()
    recorder = Recorder()
    tool_started = recorder.watch(lambda e: e.type == "tool_call")
    chattering = recorder.watch(lambda e: e.type == "text_delta")
    execution = WorkflowEngine(agents=runner).execution(flow, emitter(recorder))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:

            async def cancel_when_both_run() -> None:
                await tool_started.wait()
                await chattering.wait()
                group.cancel_scope.cancel()

            group.start_soon(cancel_when_both_run)
            await execution.run("go")
            raise AssertionError("the cancel propagates")

    types = recorder.types()
    assert [e.seq for e in recorder.events] == list(range(1, len(recorder.events) + 1))
    assert types[0] == "run_started"
    assert not TERMINAL & set(types)
    ends = recorder.of("tool_result")
    assert [(e.block_id, e.call_id, e.status) for e in ends] == [
        ("left", "left:call_w", "cancelled")
    ]
    assert "block_completed" not in recorder.types("left") + recorder.types("right")
    assert recorder.types("join") == []
    assert left.open_streams == right.open_streams == 0
    assert len(recorder.of("text_delta")) < 100


async def test_an_execution_runs_once() -> None:
    flow = workflow([], [])
    execution = WorkflowEngine().execution(flow, emitter(Recorder()))
    await execution.run()

    with pytest.raises(RuntimeError, match="runs once"):
        await execution.run()
