"""The package's public API is a deliberate, short list."""

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
