"""The DAG of a workflow: its edges by block, a cycle if there is one, who is upstream of whom.

Built from any definition, valid or not (edges naming unknown blocks are left out), so the
validation can ask it questions before the engine relies on its answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property

from agentstream.workflows.definition import Block, Edge, StartBlock, Workflow

__all__ = ["Graph"]


class Graph:
    def __init__(self, workflow: Workflow) -> None:
        self.blocks: dict[str, Block] = {block.id: block for block in workflow.blocks}
        self.incoming: dict[str, list[Edge]] = {block_id: [] for block_id in self.blocks}
        self.outgoing: dict[str, list[Edge]] = {block_id: [] for block_id in self.blocks}
        for edge in workflow.edges:
            if edge.source in self.blocks and edge.target in self.blocks:
                self.outgoing[edge.source].append(edge)
                self.incoming[edge.target].append(edge)
        starts = [block.id for block in workflow.blocks if isinstance(block, StartBlock)]
        self.start: str | None = starts[0] if len(starts) == 1 else None
        """The start block's id, if there is exactly one."""

    def successors(self, block_id: str) -> Iterator[str]:
        return (edge.target for edge in self.outgoing[block_id])

    def handles_errors(self, block_id: str) -> bool:
        """Whether the block is followed by error edges: its failure does not end the run."""
        return any(edge.on == "error" for edge in self.outgoing[block_id])

    @cached_property
    def order(self) -> list[str]:
        """The blocks in an order where each comes after its predecessors; blocks on or
        after a cycle are missing."""
        waiting = {block_id: len(edges) for block_id, edges in self.incoming.items()}
        ready = [block_id for block_id, count in waiting.items() if count == 0]
        order: list[str] = []
        while ready:
            block_id = ready.pop()
            order.append(block_id)
            for successor in self.successors(block_id):
                waiting[successor] -= 1
                if waiting[successor] == 0:
                    ready.append(successor)
        return order

    def cycle(self) -> list[str] | None:
        """Some cycle, as the blocks along it with the first repeated at the end."""
        left = self.blocks.keys() - set(self.order)
        if not left:
            return None
        # Every block left has a predecessor left: walking back must come round.
        path = [min(left)]
        while path.count(path[-1]) < 2:
            path.append(min(e.source for e in self.incoming[path[-1]] if e.source in left))
        return path[path.index(path[-1]) :][::-1]

    def reachable(self) -> set[str]:
        """The blocks some path leads to from the start block (the start included)."""
        seen: set[str] = set()
        todo = [self.start] if self.start else []
        while todo:
            block_id = todo.pop()
            if block_id not in seen:
                seen.add(block_id)
                todo.extend(self.successors(block_id))
        return seen

    @cached_property
    def ancestors(self) -> dict[str, frozenset[str]]:
        """Every block's upstream blocks: those whose outputs it may reference. Blocks on or
        after a cycle have none."""
        found: dict[str, frozenset[str]] = {block_id: frozenset() for block_id in self.blocks}
        for block_id in self.order:
            upstream = {edge.source for edge in self.incoming[block_id]}
            found[block_id] = frozenset(upstream.union(*(found[u] for u in upstream)))
        return found
