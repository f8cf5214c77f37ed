"""The package's public API is a deliberate, short list."""

import subprocess
import sys

import agentstream


def test_public_api() -> None:
    assert sorted(agentstream.__all__) == [
        "APIStatusError",
        "AgentSpec",
        "AgentstreamError",
        "AsyncClient",
        "Client",
        "ProviderError",
        "RunResult",
        "SSEDecoder",
        "ServerSentEvent",
        "Settings",
        "Tool",
        "UserError",
        "__version__",
        "create_app",
        "tool",
    ]
    for name in agentstream.__all__:
        assert getattr(agentstream, name) is not None
        if name != "__version__":
            assert getattr(agentstream, name).__module__.startswith("agentstream.")


def test_importing_the_client_loads_no_server_orm_or_numpy() -> None:
    """The SDK is for programs that only talk to a server: it must stay a light import."""
    probe = (
        "import sys, agentstream.client\n"
        "heavy = {'fastapi', 'starlette', 'sqlalchemy', 'numpy', 'uvicorn', 'openai'}\n"
        "print(sorted(heavy & {name.split('.')[0] for name in sys.modules}))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "[]"
