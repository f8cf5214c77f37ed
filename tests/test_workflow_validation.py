"""Save-time validation of workflow definitions: every problem found at once, each naming its
block and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentstream.errors import UserError
from agentstream.workflows import Issue, WorkflowInvalid, load_workflow, parse_workflow
from agentstream.workflows.expressions import FUNCTIONS

START = {"id": "start", "type": "start"}


def issues(
    blocks: list[dict[str, Any]], edges: list[dict[str, Any]] | None = None, **options: Any
) -> list[Issue]:
    with pytest.raises(WorkflowInvalid) as caught:
        parse_workflow({"id": "wf", "blocks": blocks, "edges": edges or []}, **options)
    return caught.value.issues


def edge(source: str, target: str, **more: Any) -> dict[str, Any]:
    return {"from": source, "to": target, **more}


def test_a_valid_workflow_parses() -> None:
    workflow = parse_workflow(
        {
            "id": "wf",
            "blocks": [START, {"id": "t", "type": "template", "template": "<start.input>"}],
            "edges": [edge("start", "t")],
        }
    )
    assert [b.id for b in workflow.blocks] == ["start", "t"]
    assert workflow.edges[0].model_dump(by_alias=True) == {
        "from": "start",
        "to": "t",
        "on": "success",
        "branch": None,
    }


def test_the_error_is_a_user_error_naming_the_first_field_and_listing_all() -> None:
    with pytest.raises(WorkflowInvalid) as caught:
        parse_workflow({"id": "wf", "blocks": [START, {"id": "a", "type": "agent"}], "edges": []})
    error = caught.value
    assert isinstance(error, UserError)
    assert error.status_code == 422
    assert error.field == "blocks.a.agent"
    assert error.message == "block 'a' field 'agent': Field required (and 1 more)"
    assert [i.as_dict() for i in error.issues] == [
        {"block_id": "a", "field": "agent", "message": "Field required"},
        {"block_id": "a", "field": "input", "message": "Field required"},
    ]


def test_a_cycle_is_refused_naming_its_blocks() -> None:
    found = issues(
        [
            START,
            {"id": "a", "type": "template", "template": "a"},
            {"id": "b", "type": "template", "template": "b"},
        ],
        [edge("start", "a"), edge("a", "b"), edge("b", "a")],
    )
    assert found == [Issue("a", None, "part of a cycle: a -> b -> a")]


def test_a_block_leading_to_itself_is_a_cycle() -> None:
    found = issues(
        [START, {"id": "a", "type": "template", "template": "a"}],
        [edge("start", "a"), edge("a", "a")],
    )
    assert found == [Issue("a", None, "part of a cycle: a -> a")]


def test_references_must_name_an_upstream_block_and_one_of_its_outputs() -> None:
    found = issues(
        [
            START,
            {"id": "a", "type": "template", "template": "<ghost.text> <b.text> <start.inptu>"},
            {"id": "b", "type": "template", "template": "<a.text> <b.text>"},
        ],
        [edge("start", "a"), edge("a", "b")],
    )
    assert found == [
        Issue("a", "template", "'ghost.text' names no block"),
        Issue("a", "template", "'b.text': 'b' is not upstream of 'a'"),
        Issue("a", "template", "'start.inptu': 'start' has no output 'inptu'; it has: input"),
        Issue("b", "template", "'b.text': 'b' is not upstream of 'b'"),
    ]


def test_the_error_output_can_be_referenced_only_through_an_error_edge() -> None:
    blocks = [
        START,
        {"id": "f", "type": "function", "expression": "1"},
        {"id": "h", "type": "template", "template": "<f.error>"},
    ]
    found = issues(blocks, [edge("start", "f"), edge("f", "h")])
    assert found == [Issue("h", "template", "'f.error': 'f' has no output 'error'; it has: result")]

    parse_workflow(
        {"id": "wf", "blocks": blocks, "edges": [edge("start", "f"), edge("f", "h", on="error")]}
    )


def test_expressions_are_checked_with_their_references() -> None:
    found = issues(
        [
            START,
            {
                "id": "c",
                "type": "condition",
                "branches": [
                    {"name": "yes", "when": "start.input > later.result"},
                    {"name": "no", "when": "__import__('os')"},
                ],
            },
            {"id": "later", "type": "function", "expression": "start.input +"},
        ],
        [edge("start", "c"), edge("c", "later", branch="yes")],
    )
    assert found == [
        Issue("c", "branches.0.when", "'later.result': 'later' is not upstream of 'c'"),
        Issue(
            "c", "branches.1.when", f"only these functions may be called: {', '.join(FUNCTIONS)}"
        ),
        Issue("later", "expression", "invalid syntax at the end"),
    ]


@pytest.mark.parametrize("text", ["-" * 3000 + "1", "1 + " * 999 + "1"])
def test_an_expression_nested_too_deeply_is_an_issue_not_a_crash(text: str) -> None:
    found = issues(
        [START, {"id": "f", "type": "function", "expression": text}], [edge("start", "f")]
    )
    assert found == [Issue("f", "expression", "nested too deeply (more than 200 levels)")]


def test_an_inline_agent_needing_a_run_is_refused_naming_what_to_use() -> None:
    boss = {"id": "boss", "delegates": ["helper"]}
    found = issues(
        [START, {"id": "a", "type": "agent", "agent": boss, "input": "x"}], [edge("start", "a")]
    )
    assert found == [
        Issue(
            "a",
            "agent",
            "Agent 'boss' delegates to other agents, which an agent block cannot do: "
            "use an orchestration block",
        )
    ]


def test_unknown_and_missing_block_types_are_refused_naming_the_block() -> None:
    found = issues([START, {"id": "x", "type": "teleport"}, {"id": "y"}])
    known = "start, agent, orchestration, condition, function, http, template, response"
    assert found == [
        Issue("x", "type", f"unknown block type 'teleport'; known: {known}"),
        Issue("y", "type", f"missing; known types: {known}"),
    ]


def test_edges_must_join_known_blocks() -> None:
    found = issues(
        [START, {"id": "a", "type": "template", "template": "a"}],
        [edge("start", "a"), edge("a", "nowhere"), edge("nobody", "a")],
    )
    assert found == [
        Issue(None, "edges.1.to", "no block 'nowhere'"),
        Issue(None, "edges.2.from", "no block 'nobody'"),
    ]


def test_a_workflow_has_exactly_one_start_block() -> None:
    assert issues([{"id": "t", "type": "template", "template": "t"}]) == [
        Issue(None, "blocks", "a workflow needs a start block")
    ]
    assert issues([START, {"id": "again", "type": "start"}], [edge("start", "again")]) == [
        Issue("again", "type", "a second start block (the first is 'start')"),
        Issue("again", "edges.0.to", "nothing may lead into the start block"),
    ]


def test_blocks_no_path_leads_to_are_unreachable() -> None:
    found = issues(
        [
            START,
            {"id": "island", "type": "template", "template": "i"},
            {"id": "after_island", "type": "template", "template": "j"},
        ],
        [edge("island", "after_island")],
    )
    assert found == [
        Issue("island", None, "unreachable: no path leads to it from 'start'"),
        Issue("after_island", None, "unreachable: no path leads to it from 'start'"),
    ]


def test_block_ids_are_unique_identifiers() -> None:
    found = issues(
        [
            START,
            {"id": "a", "type": "template", "template": "1"},
            {"id": "a", "type": "template", "template": "2"},
        ],
        [edge("start", "a")],
    )
    assert found == [Issue("a", "id", "2 blocks have this id")]
    [bad] = issues([START, {"id": "has-dash", "type": "template", "template": "x"}])
    assert (bad.block_id, bad.field) == ("has-dash", "id")


@pytest.mark.parametrize(
    ("block", "field", "message"),
    [
        ({"type": "agent", "input": "x"}, "agent", "Field required"),
        ({"type": "agent", "agent": "a"}, "input", "Field required"),
        ({"type": "orchestration", "input": "x"}, "orchestration", "Field required"),
        ({"type": "condition"}, "branches", "Field required"),
        ({"type": "condition", "branches": []}, "branches", "List should have at least 1 item"),
        ({"type": "http"}, "url", "Field required"),
        ({"type": "http", "url": "http://x", "method": "TRACE"}, "method", "Input should be"),
        ({"type": "template"}, "template", "Field required"),
        ({"type": "response"}, "output", "Field required"),
        ({"type": "template", "template": "x", "colour": 1}, "colour", "Extra inputs"),
        ({"type": "function"}, None, "give exactly one of"),
        (
            {"type": "function", "expression": "1", "function": "f"},
            None,
            "give exactly",
        ),
        ({"type": "function", "expression": "1", "args": {"a": 1}}, None, "'args' go"),
        (
            {"type": "condition", "branches": [{"name": "a"}, {"name": "b", "when": "1"}]},
            None,
            "only the last branch may omit 'when'",
        ),
    ],
)
def test_each_block_type_requires_its_configuration(
    block: dict[str, Any], field: str | None, message: str
) -> None:
    [found] = issues([START, {"id": "b", **block}], [edge("start", "b")])
    assert (found.block_id, found.field) == ("b", field)
    assert found.message.startswith(message)


def test_edges_out_of_conditions_name_one_of_their_branches() -> None:
    condition = {"id": "c", "type": "condition", "branches": [{"name": "yes", "when": "1"}]}
    found = issues(
        [START, condition, {"id": "t", "type": "template", "template": "t"}],
        [
            edge("start", "c", branch="yes"),
            edge("c", "t"),
            edge("c", "t", branch="maybe"),
            edge("c", "t", on="error", branch="yes"),
        ],
    )
    assert found == [
        Issue("start", "edges.0.branch", "only edges leaving a condition block have a branch"),
        Issue("c", "edges.1.branch", "say which branch of the condition this edge leaves by"),
        Issue("c", "edges.2.branch", "no branch 'maybe'; branches: yes"),
        Issue("c", "edges.3.branch", "an error edge has no branch"),
    ]


def test_a_response_block_ends_its_branch_and_edges_are_not_repeated() -> None:
    found = issues(
        [
            START,
            {"id": "r", "type": "response", "output": 1},
            {"id": "t", "type": "template", "template": "t"},
        ],
        [edge("start", "r"), edge("start", "r"), edge("r", "t")],
    )
    assert found == [
        Issue("start", "edges.1", "a second edge to 'r'"),
        Issue("r", "edges.2.from", "a response block ends its branch"),
    ]


def test_function_names_are_checked_when_the_registry_is_given() -> None:
    blocks = [START, {"id": "f", "type": "function", "function": "shout"}]
    edges = [edge("start", "f")]
    assert issues(blocks, edges, functions=["whisper"]) == [
        Issue("f", "function", "no function 'shout'; known: whisper")
    ]
    parse_workflow({"id": "wf", "blocks": blocks, "edges": edges})


def test_workflows_load_from_yaml_and_json_files(tmp_path: Path) -> None:
    (tmp_path / "flow.yaml").write_text(
        """
id: greeter
blocks:
  - {id: start, type: start}
  - id: greet
    type: template
    template: "Hello <start.input>"
  - id: oops
    type: template
    template: "Sorry"
edges:
  - {from: start, to: greet}
  - from: greet
    to: oops
    on: error
""",
        encoding="utf-8",
    )
    from_yaml = load_workflow(tmp_path / "flow.yaml")
    assert from_yaml.edges[1].on == "error"  # YAML 1.1 would read the key `on` as True
    (tmp_path / "flow.json").write_text(
        json.dumps(from_yaml.model_dump(mode="json", by_alias=True)), encoding="utf-8"
    )
    assert load_workflow(tmp_path / "flow.json") == from_yaml

    (tmp_path / "bad.json").write_text('{"id": "x", "blocks": [{"id": "start"}]}')
    with pytest.raises(WorkflowInvalid, match="block 'start' field 'type'"):
        load_workflow(tmp_path / "bad.json")
