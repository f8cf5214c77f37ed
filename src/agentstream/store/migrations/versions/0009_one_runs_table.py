"""one runs table: workflow executions and their events join agent runs

Every row of ``workflow_executions`` becomes a row of ``runs`` with ``kind = 'workflow'``
(its id, ``wfx_…``, unchanged), every row of ``workflow_events`` a row of ``run_events``,
its payload rewritten to the one event vocabulary (``execution_id`` is ``run_id``; the
terminal events are ``run_completed`` / ``run_failed``; a block's reasoning and tool calls
are the agent events with a ``block_id``). Then the workflow tables are dropped. An agent
run's ``input`` becomes JSON (a string); its events are kept as they are.

The mapping is written out here, not imported: a migration must not change when the
application does.

Downgrade is not supported (it raises): restore the backup taken before upgrading.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 08:00:00
"""

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_runs = sa.table(
    "runs",
    sa.column("id", sa.String),
    sa.column("kind", sa.String),
    sa.column("status", sa.String),
    sa.column("input", sa.JSON),
    sa.column("result", sa.JSON),
    sa.column("error", sa.Text),
    sa.column("input_tokens", sa.Integer),
    sa.column("output_tokens", sa.Integer),
    sa.column("created_at", sa.DateTime(timezone=True)),
    sa.column("finished_at", sa.DateTime(timezone=True)),
    sa.column("workflow_id", sa.String),
    sa.column("workflow_version", sa.Integer),
    sa.column("draft", sa.Boolean),
    sa.column("definition", sa.JSON),
)
_executions = sa.table(
    "workflow_executions",
    sa.column("id", sa.String),
    sa.column("status", sa.String),
    sa.column("input", sa.JSON),
    sa.column("result", sa.JSON),
    sa.column("error", sa.Text),
    sa.column("created_at", sa.DateTime(timezone=True)),
    sa.column("finished_at", sa.DateTime(timezone=True)),
    sa.column("workflow_id", sa.String),
    sa.column("workflow_version", sa.Integer),
    sa.column("draft", sa.Boolean),
    sa.column("definition", sa.JSON),
)
_run_events = sa.table(
    "run_events",
    sa.column("run_id", sa.String),
    sa.column("seq", sa.Integer),
    sa.column("type", sa.String),
    sa.column("ts", sa.Float),
    sa.column("payload", sa.JSON),
)
_workflow_events = sa.table(
    "workflow_events",
    sa.column("execution_id", sa.String),
    sa.column("seq", sa.Integer),
    sa.column("ts", sa.Float),
    sa.column("payload", sa.JSON),
)
_BATCH = 1000


def upgrade() -> None:
    connection = op.get_bind()
    if connection.dialect.name == "sqlite":  # PostgreSQL converts in ALTER ... USING
        op.execute("UPDATE runs SET input = json_quote(input)")
    with op.batch_alter_table("runs") as batch_op:
        batch_op.add_column(sa.Column("kind", sa.String(length=10), nullable=True))
        batch_op.add_column(sa.Column("result", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("workflow_id", sa.String(length=100), nullable=True))
        batch_op.add_column(sa.Column("workflow_version", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("draft", sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column("definition", sa.JSON(), nullable=True))
        batch_op.alter_column(
            "input",
            existing_type=sa.Text(),
            type_=sa.JSON(),
            nullable=True,
            postgresql_using="to_json(input)",
        )
        batch_op.alter_column("agent_id", existing_type=sa.String(length=100), nullable=True)
        batch_op.alter_column("agent_version", existing_type=sa.Integer(), nullable=True)
        batch_op.alter_column("session_id", existing_type=sa.String(length=40), nullable=True)
        batch_op.alter_column("reasoning_requested", existing_type=sa.Boolean(), nullable=True)
        batch_op.create_index(batch_op.f("ix_runs_workflow_id"), ["workflow_id"], unique=False)
    op.execute(_runs.update().values(kind="agent"))

    columns = [c.name for c in _executions.c]
    op.execute(
        _runs.insert().from_select(
            [*columns, "kind", "input_tokens", "output_tokens"],
            sa.select(*_executions.c, sa.literal("workflow"), sa.literal(0), sa.literal(0)),
        )
    )
    for rows in _batches(_rewritten_events(connection)):
        connection.execute(_run_events.insert(), rows)

    op.drop_table("workflow_events")
    with op.batch_alter_table("workflow_executions") as batch_op:
        batch_op.drop_index(batch_op.f("ix_workflow_executions_workflow_id"))
        batch_op.drop_index(batch_op.f("ix_workflow_executions_status"))
    op.drop_table("workflow_executions")
    with op.batch_alter_table("runs") as batch_op:
        batch_op.alter_column("kind", existing_type=sa.String(length=10), nullable=False)


def downgrade() -> None:
    raise NotImplementedError(
        "Revision 0009 (one runs table) cannot be undone: restore the database backed up "
        "before the upgrade"
    )


def _rewritten_events(connection: sa.Connection) -> Iterator[dict[str, Any]]:
    """Every workflow event as a ``run_events`` row in the one vocabulary, in seq order."""
    reasoning_steps: Counter[tuple[str, str]] = Counter()
    query = sa.select(_workflow_events).order_by(
        _workflow_events.c.execution_id, _workflow_events.c.seq
    )
    for row in connection.execute(query).mappings():
        payload = _unified(row["payload"], reasoning_steps)
        yield {
            "run_id": row["execution_id"],
            "seq": row["seq"],
            "type": payload["type"],
            "ts": row["ts"],
            "payload": payload,
        }


def _unified(old: dict[str, Any], reasoning_steps: Counter[tuple[str, str]]) -> dict[str, Any]:
    """One workflow event's payload in the one vocabulary. ``reasoning_steps`` counts each
    block's reasoning so far, which numbers the block's reasoning steps."""
    fields = {("run_id" if key == "execution_id" else key): value for key, value in old.items()}
    head = {"run_id": fields.pop("run_id"), "seq": fields.pop("seq"), "ts": fields.pop("ts")}
    kind = fields.pop("type")
    body: dict[str, Any]
    if kind == "workflow_start":
        body = {
            "type": "run_started",
            "workflow_id": fields["workflow_id"],
            "agent_id": None,
            "session_id": None,
        }
    elif kind == "workflow_complete":
        body = {
            "type": "run_completed",
            "result": fields.get("result"),
            "content": "",
            "usage": {"input_tokens": 0, "output_tokens": 0, "cost_usd": None},
        }
    elif kind == "workflow_error":
        body = {
            "type": "run_failed",
            "status": "error",
            "message": fields["error"],
            "failed_block": fields.get("block_id"),
        }
    elif kind == "workflow_cancelled":
        body = {
            "type": "run_failed",
            "status": fields.get("status") or "cancelled",
            "message": fields["reason"],
            "failed_block": None,
        }
    elif kind == "block_reasoning":
        block = fields["block_id"]
        reasoning_steps[head["run_id"], block] += 1
        step = reasoning_steps[head["run_id"], block]
        body = {"type": "reasoning", "block_id": block, "step": step, "text": fields["text"]}
    elif kind == "block_tool" and fields["phase"] == "start":
        body = {
            "type": "tool_call",
            "block_id": fields["block_id"],
            "step": 1,
            "call_id": fields["call_id"],
            "tool_name": fields["name"],
            "arguments": fields.get("arguments") or {},
        }
    elif kind == "block_tool":
        body = {
            "type": "tool_result",
            "block_id": fields["block_id"],
            "step": 1,
            "call_id": fields["call_id"],
            "tool_name": fields["name"],
            "status": fields.get("status") or "success",
            "result": fields.get("result"),
        }
    else:  # block_started, block_output, block_completed, block_error, block_skipped
        body = {"type": kind, **fields}
    return {**head, **body}


def _batches(rows: Iterator[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) == _BATCH:
            yield batch
            batch = []
    if batch:
        yield batch
