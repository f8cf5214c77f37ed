"""YAML files as people write them, and mistakes reported where they are.

Two things PyYAML's ``safe_load`` gets in the way of: it reads YAML 1.1, where ``on``,
``off``, ``yes`` and ``no`` are booleans (so a workflow edge's ``on: error`` became the key
``True``), and it forgets where each value stood, so a mistake could only be told as a
path. Here only ``true``/``false`` are booleans (YAML 1.2), and ``YamlFile.where`` gives
the ``file:line`` of any value by its path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from agentstream.errors import ConfigError
from agentstream.inputs import message_of

__all__ = ["YamlFile", "read_yaml"]

_BOOL = "tag:yaml.org,2002:bool"


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), "tTfF")


@dataclass(frozen=True, slots=True)
class YamlFile:
    """A parsed file and its node tree, to find where a value came from."""

    path: Path
    data: Any
    root: yaml.Node | None

    def where(self, loc: Sequence[str | int]) -> str:
        """``file:line`` of the value at ``loc`` (keys and list indexes), or of the nearest
        enclosing value that exists."""
        node, line = self.root, 1
        for part in loc:
            if node is None:
                break
            line = node.start_mark.line + 1
            node = _child(node, part)
        if node is not None:
            line = node.start_mark.line + 1
        return f"{self.path}:{line}"

    def invalid(self, exc: ValidationError, *, within: Sequence[str | int] = ()) -> ConfigError:
        """The first problem pydantic found, as one line naming its place in this file."""
        error = exc.errors()[0]
        loc = (*within, *error["loc"])
        return ConfigError(f"{self.where(loc)}: {_dotted(loc)}: {message_of(error)}")


def read_yaml(path: Path) -> YamlFile:
    """Parse ``path``; a file that cannot be read or parsed is a ``ConfigError`` naming the
    file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it: {exc}") from None
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 1
        raise ConfigError(f"{path}:{line}: not valid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()
    return YamlFile(path, data, root)


def _child(node: yaml.Node, part: str | int) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        return next((value for key, value in node.value if key.value == str(part)), None)
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        child: yaml.Node = node.value[part]
        return child
    return None


def _dotted(loc: Sequence[str | int]) -> str:
    """``("agents", 0, "model")`` as ``agents[0].model``."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
