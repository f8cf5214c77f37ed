"""The agents file as people write it: YAML 1.2 booleans (a workflow edge's ``on: error``
stays the key ``on``), and every mistake one readable line naming the file and line,
before the server touches any data."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentstream import cli
from conftest import make_settings, serve

WITH_ERROR_EDGE = """\
agents:
  - {id: helper, tools: [calculator]}
workflows:
  - id: guarded
    blocks:
      - {id: start, type: start}
      - {id: ask, type: agent, agent: helper, input: "<start.input>"}
      - {id: sorry, type: template, template: "Sorry"}
    edges:
      - {from: start, to: ask}
      - from: ask
        to: sorry
        on: error
"""


def test_an_error_edge_written_as_on_error_is_accepted(tmp_path: Path) -> None:
    definitions = tmp_path / "agents.yaml"
    definitions.write_text(WITH_ERROR_EDGE)
    with (
        serve(make_settings(tmp_path, agents_file=definitions)) as live,
        live.client() as client,
    ):
        workflow = client.get("/api/workflows/guarded").json()
    edges = workflow["workflow"]["edges"]
    assert {"from": "ask", "to": "sorry", "on": "error", "branch": None} in edges


MISTAKES = {
    "bad YAML": (
        """\
        agents:
          - id: helper
            tools: [calculator
        """,
        4,
        "not valid YAML",
    ),
    "unknown key": (
        """\
        agents:
          - id: helper
            modle: offline
        """,
        3,
        "agents[0].modle: Extra inputs are not permitted",
    ),
    "unknown model": (
        """\
        agents:
          - id: fine
          - id: helper
            instructions: Be terse.
            model: gpt-9-ultra
        """,
        5,
        "agent 'helper': Unknown model 'gpt-9-ultra'",
    ),
    "unknown tool": (
        """\
        agents:
          - id: helper
            tools: [calculator, teleport]
        """,
        3,
        "Unknown tools ['teleport']",
    ),
    "bad workflow": (
        """\
        workflows:
          - id: broken
            blocks:
              - {id: start, type: start}
              - {id: say, type: template, template: "<nowhere.text>"}
            edges:
              - {from: start, to: say}
        """,
        5,
        "workflow 'broken': block 'say'",
    ),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_mistake_is_one_line_naming_file_and_line_and_nothing_is_touched(
    tmp_path: Path, mistake: str
) -> None:
    text, line, message = MISTAKES[mistake]
    definitions = tmp_path / "agents.yaml"
    definitions.write_text(textwrap.dedent(text))
    data_dir = tmp_path / "data"

    result = CliRunner().invoke(
        cli.app, ["serve", "--agents", str(definitions), "--data-dir", str(data_dir)]
    )

    assert result.exit_code == 1
    output = " ".join(result.output.split())  # the console may wrap a long line
    assert output.startswith(f"{definitions}:{line}: "), result.output
    assert message in output
    assert "Traceback" not in result.output
    assert not data_dir.exists()  # refused before any database was made
