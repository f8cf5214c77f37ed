"""The machine and software the figures were measured on."""

from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PACKAGES = (
    "agentstream",
    "fastapi",
    "starlette",
    "uvicorn",
    "uvloop",
    "httptools",
    "pydantic",
    "sqlalchemy",
    "aiosqlite",
    "pydantic-ai-slim",
    "langgraph",
    "langchain-core",
)


def describe() -> dict[str, object]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    os_release = Path("/etc/os-release")
    pretty = next(
        (
            line.split("=", 1)[1].strip('"')
            for line in (os_release.read_text().splitlines() if os_release.exists() else [])
            if line.startswith("PRETTY_NAME=")
        ),
        platform.platform(),
    )
    memory_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(memory_kib / 1024**2),
        "os": f"{pretty}, Linux {platform.release()}",
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES},
    }


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def markdown(machine: dict[str, object]) -> str:
    packages = machine["packages"]
    assert isinstance(packages, dict)
    listed = ", ".join(f"{name} {v}" for name, v in packages.items())
    return (
        f"Measured on {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB; "
        f"{machine['os']}; Python {machine['python']}.\n\nPackages: {listed}."
    )
