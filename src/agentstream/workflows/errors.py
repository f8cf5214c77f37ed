"""What goes wrong with workflows: a definition refused at save time, or a block that failed.

AgentstreamError (agentstream.errors)
├── UserError
│   └── WorkflowInvalid   the definition has problems: ``issues`` names each block and field
└── RunError
    └── BlockFailed       a block could not produce its output; the message is for people
        ├── ExpressionError   (expressions) refused or failed expression
        ├── BadReference      (references) a reference points at data that is not there
        └── AddressRefused    (http_block) an HTTP block's host is not allowed
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from agentstream.errors import RunError, UserError

__all__ = ["BlockFailed", "Issue", "WorkflowInvalid"]


@dataclass(frozen=True, slots=True)
class Issue:
    """One problem of a workflow definition."""

    block_id: str | None
    """The block at fault; None for the workflow as a whole."""
    field: str | None
    """The field at fault, e.g. ``input`` or ``edges.2.to``."""
    message: str

    def as_dict(self) -> dict[str, str | None]:
        return asdict(self)

    def __str__(self) -> str:
        where = " ".join(
            part
            for part in (
                f"block {self.block_id!r}" if self.block_id else "",
                f"field {self.field!r}" if self.field else "",
            )
            if part
        )
        return f"{where}: {self.message}" if where else self.message


class WorkflowInvalid(UserError):
    """The definition cannot be saved or run; ``issues`` lists every problem found."""

    code = "invalid_workflow"

    def __init__(self, issues: list[Issue]) -> None:
        first = issues[0]
        more = f" (and {len(issues) - 1} more)" if len(issues) > 1 else ""
        field = ".".join(p for p in ("blocks", first.block_id, first.field) if p)
        super().__init__(f"{first}{more}", field=field if first.block_id else first.field)
        self.issues = issues


class BlockFailed(RunError):
    """A block could not produce its output. The message is shown to whoever watches the
    execution, so it says what went wrong without internals."""
