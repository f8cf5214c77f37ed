"""Save-time validation: every problem of a definition at once, each naming its block and field.

``parse_workflow`` is what an API or a file loader calls; it raises ``WorkflowInvalid``
(a ``UserError``: HTTP 422) carrying the list of issues.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, get_args

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from agentstream.agents import AgentSpec
from agentstream.inputs import message_of
from agentstream.workflows.definition import (
    AgentBlock,
    Block,
    ConditionBlock,
    FunctionBlock,
    ResponseBlock,
    StartBlock,
    Workflow,
)
from agentstream.workflows.errors import Issue, WorkflowInvalid
from agentstream.workflows.expressions import ExpressionError, parse_expression
from agentstream.workflows.graph import Graph
from agentstream.workflows.references import Reference, find_references
from agentstream.workflows.runners import needs_a_run
from agentstream.yamlfile import read_yaml

__all__ = ["check_workflow", "load_workflow", "parse_workflow"]

BLOCK_TYPES = tuple(
    get_args(kind.model_fields["type"].annotation)[0] for kind in get_args(get_args(Block)[0])
)


def parse_workflow(data: Any, *, functions: Collection[str] | None = None) -> Workflow:
    """A valid workflow from a plain object (parsed JSON or YAML).

    With ``functions``, the names function blocks may call are checked too.
    """
    try:
        workflow = Workflow.model_validate(data)
    except ValidationError as exc:
        raise WorkflowInvalid([_issue(error, data) for error in exc.errors()]) from None
    if issues := check_workflow(workflow, functions=functions):
        raise WorkflowInvalid(issues)
    return workflow


def load_workflow(path: Path, *, functions: Collection[str] | None = None) -> Workflow:
    """A valid workflow from a ``.json`` file, or a YAML one."""
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
    else:
        data = read_yaml(path).data
    return parse_workflow(data, functions=functions)


def check_workflow(workflow: Workflow, *, functions: Collection[str] | None = None) -> list[Issue]:
    """What is wrong with the graph of a well-shaped workflow; [] if nothing."""
    graph = Graph(workflow)
    issues = [*_check_blocks(workflow), *_check_edges(workflow, graph)]
    if cycle := graph.cycle():
        issues.append(Issue(cycle[0], None, f"part of a cycle: {' -> '.join(cycle)}"))
    elif graph.start is not None:
        reachable = graph.reachable()
        issues += [
            Issue(block.id, None, f"unreachable: no path leads to it from {graph.start!r}")
            for block in workflow.blocks
            if block.id not in reachable
        ]
    if not issues:  # references are only meaningful in a sound graph
        for block in workflow.blocks:
            issues += _check_references(block, graph, functions)
    return issues


def _check_blocks(workflow: Workflow) -> Iterator[Issue]:
    counts = Counter(block.id for block in workflow.blocks)
    for block_id, count in counts.items():
        if count > 1:
            yield Issue(block_id, "id", f"{count} blocks have this id")
    starts = [block.id for block in workflow.blocks if isinstance(block, StartBlock)]
    if not starts:
        yield Issue(None, "blocks", "a workflow needs a start block")
    for extra in starts[1:]:
        yield Issue(extra, "type", f"a second start block (the first is {starts[0]!r})")
    for block in workflow.blocks:  # a saved agent is checked when its block runs
        match block:
            case AgentBlock(agent=AgentSpec() as spec) if reason := needs_a_run(spec):
                yield Issue(block.id, "agent", reason)


def _check_edges(workflow: Workflow, graph: Graph) -> Iterator[Issue]:
    seen: set[tuple[str, str, str, str | None]] = set()
    for i, edge in enumerate(workflow.edges):
        source = graph.blocks.get(edge.source)
        for end, block_id in (("from", edge.source), ("to", edge.target)):
            if block_id not in graph.blocks:
                yield Issue(None, f"edges.{i}.{end}", f"no block {block_id!r}")
        if source is None or edge.target not in graph.blocks:
            continue
        key = (edge.source, edge.target, edge.on, edge.branch)
        if key in seen:
            yield Issue(edge.source, f"edges.{i}", f"a second edge to {edge.target!r}")
        seen.add(key)
        if isinstance(graph.blocks[edge.target], StartBlock):
            yield Issue(edge.target, f"edges.{i}.to", "nothing may lead into the start block")
        if isinstance(source, ResponseBlock):
            yield Issue(source.id, f"edges.{i}.from", "a response block ends its branch")
        yield from _check_branch(i, edge.on, edge.branch, source)


def _check_branch(i: int, on: str, branch: str | None, source: Block) -> Iterator[Issue]:
    field = f"edges.{i}.branch"
    if not isinstance(source, ConditionBlock):
        if branch is not None:
            yield Issue(source.id, field, "only edges leaving a condition block have a branch")
    elif on == "error":
        if branch is not None:
            yield Issue(source.id, field, "an error edge has no branch")
    elif branch is None:
        yield Issue(source.id, field, "say which branch of the condition this edge leaves by")
    elif branch not in (names := [b.name for b in source.branches]):
        yield Issue(source.id, field, f"no branch {branch!r}; branches: {', '.join(names)}")


def _check_references(
    block: Block, graph: Graph, functions: Collection[str] | None
) -> Iterator[Issue]:
    for field in block.templated:
        for reference in find_references(getattr(block, field)):
            if problem := _reference_problem(reference, block.id, graph):
                yield Issue(block.id, field, problem)
    for field, text in block.expressions().items():
        try:
            expression = parse_expression(text)
        except ExpressionError as exc:
            yield Issue(block.id, field, str(exc))
            continue
        for reference in expression.references():
            if problem := _reference_problem(reference, block.id, graph):
                yield Issue(block.id, field, problem)
    if (
        isinstance(block, FunctionBlock)
        and block.function is not None
        and functions is not None
        and block.function not in functions
    ):
        known = ", ".join(sorted(functions)) or "none"
        yield Issue(block.id, "function", f"no function {block.function!r}; known: {known}")


def _reference_problem(reference: Reference, block_id: str, graph: Graph) -> str | None:
    target = graph.blocks.get(reference.block_id)
    if target is None:
        return f"{_show(reference)} names no block"
    if reference.block_id not in graph.ancestors[block_id]:
        return f"{_show(reference)}: {target.id!r} is not upstream of {block_id!r}"
    fields = (*target.outputs, "error") if graph.handles_errors(target.id) else target.outputs
    if reference.path and reference.path[0] not in fields:
        return f"{_show(reference)}: {target.id!r} has no output {reference.path[0]!r}; " + (
            f"it has: {', '.join(fields)}"
        )
    return None


def _show(reference: Reference) -> str:
    return repr(".".join((reference.block_id, *reference.path)))


def _issue(error: ErrorDetails, data: Any) -> Issue:
    """A pydantic error as an issue: ``("blocks", 2, "agent", "input")`` becomes the block's
    id (read from the raw data) and ``input``."""
    location = list(error["loc"])
    if location[:1] != ["blocks"] or len(location) < 2:
        return Issue(None, ".".join(map(str, location)) or None, message_of(error))
    raw = _raw_block(data, location[1])
    block_id = raw.get("id") if isinstance(raw.get("id"), str) else None
    rest = location[3:]  # past the block type the union member is named by
    if error["type"] == "union_tag_invalid":
        known = ", ".join(BLOCK_TYPES)
        return Issue(block_id, "type", f"unknown block type {raw.get('type')!r}; known: {known}")
    if error["type"] == "union_tag_not_found":
        return Issue(block_id, "type", f"missing; known types: {', '.join(BLOCK_TYPES)}")
    field = ".".join(map(str, rest)) or None
    if block_id is None:
        field = ".".join(map(str, location[:2] + rest))
    return Issue(block_id, field, message_of(error))


def _raw_block(data: Any, index: Any) -> Mapping[str, Any]:
    blocks = data.get("blocks") if isinstance(data, Mapping) else None
    if isinstance(blocks, list) and isinstance(index, int) and index < len(blocks):
        raw = blocks[index]
        if isinstance(raw, Mapping):
            return raw
    return {}
