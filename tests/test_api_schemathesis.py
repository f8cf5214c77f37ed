"""Schemathesis over the OpenAPI document against a real server (the demo setup, its key):
generated requests, valid and not, to every operation, and no response contradicts the
document: no 5xx, every status documented, every body (stream events included) valid
against its schema, the documented content type and headers. A bounded budget, one seed:
the documented examples, then a few generated cases per operation."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import LiveServer

CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
]


def test_no_response_contradicts_the_openapi_document(server: LiveServer, tmp_path: Path) -> None:
    st = Path(sys.executable).with_name("st")
    done = subprocess.run(
        [
            str(st),
            "run",
            f"{server.url}/openapi.json",
            "--header",
            f"apikey: {server.key}",
            "--checks",
            ",".join(CHECKS),
            "--phases",
            "examples,fuzzing",
            "--max-examples",
            "8",
            "--seed",
            "1",
            "--workers",
            "1",
            "--request-timeout",
            "20",
            "--report-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=tmp_path,  # its cache and reports stay out of the repository
    )
    assert done.returncode == 0, done.stdout[-20_000:] + done.stderr[-5_000:]
    summary = re.search(r"(\d+) generated, (\d+) passed", done.stdout)
    assert summary is not None, done.stdout[-2_000:]
    assert summary[1] == summary[2]
    assert int(summary[1]) > 200  # the examples and fuzzing of every operation ran
