"""The model registry: the catalog, availability by key, costs, the API and the docs page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentstream.agents import AgentSpec
from agentstream.events import Usage
from agentstream.providers.base import ModelPart, ModelRequest, TextPart, TurnEndPart, UsagePart
from agentstream.providers.catalog import Catalog, capability_table, load_catalog
from agentstream.providers.reachability import Reachability
from agentstream.providers.registry import ModelRegistry
from agentstream.providers.scripted import ScriptedModel
from conftest import LiveServer, free_port, make_settings, serve, stream_frames
from fakes.openai import FakeOpenAI, chat_text

DOCS = Path(__file__).parents[1] / "docs" / "models.md"


def test_docs_page_is_generated_from_the_catalog() -> None:
    assert DOCS.read_text() == capability_table(load_catalog()), "run `make docs`"


def test_catalog_is_consistent() -> None:
    catalog = load_catalog()
    families = {catalog.providers[m.provider].kind for m in catalog.models}
    assert {"offline", "openai", "anthropic", "gemini", "openai_compatible"} <= families
    with pytest.raises(ValueError, match="unknown providers"):
        Catalog.model_validate({"providers": {}, "models": [{"name": "x", "provider": "nope"}]})


def test_costs_come_from_list_prices() -> None:
    info = load_catalog().model("claude-sonnet-4-5")
    assert info is not None
    priced = info.priced(Usage(input_tokens=1_000_000, output_tokens=200_000))
    assert priced.cost_usd == pytest.approx(3.00 + 0.2 * 15.00)
    assert (priced + priced).cost_usd == pytest.approx(12.00)
    assert (priced + Usage()).cost_usd is None, "an unknown price makes the total unknown"


def test_a_model_needs_its_providers_key(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = ModelRegistry(load_catalog())
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert registry.available("claude-sonnet-4-5") == (
        "Set ANTHROPIC_API_KEY to use claude-sonnet-4-5 (Anthropic)"
    )
    assert registry.available("ollama/llama3.1") is None, "local servers need no key"
    assert registry.available("offline") is None
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    assert registry.available("claude-sonnet-4-5") is None
    assert registry.get("claude-sonnet-4-5").name == "claude-sonnet-4-5"


def test_user_catalog_adds_models(tmp_path: Path) -> None:
    own = tmp_path / "models.yaml"
    own.write_text(
        "providers:\n  mine: {kind: openai_compatible, label: Mine, base_url: http://x/v1,"
        " key_required: false}\n"
        "models:\n  - {name: mine/small, provider: mine, api_model: small, input_price: 1,"
        " output_price: 2}\n"
    )
    catalog = load_catalog(own)
    assert catalog.model("mine/small") is not None
    assert catalog.model("gpt-4.1") is not None


def test_models_api_lists_prices_capabilities_and_readiness(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with server.client() as client:
        listed = {m["model"]["name"]: m for m in client.get("/api/models").json()}
    assert listed["offline"]["available"] is True
    assert listed["gpt-4.1"]["available"] is False
    assert listed["gpt-4.1"]["unavailable_reason"] == "Set OPENAI_API_KEY to use gpt-4.1 (OpenAI)"
    assert listed["gpt-4.1"]["model"]["input_price"] == 2.0
    assert listed["o4-mini"]["model"]["capabilities"]["thinking"] == "summary"


def test_running_an_agent_whose_key_is_missing_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    with serve(
        make_settings(tmp_path), agents=[AgentSpec(id="g", model="gemini-2.5-flash")]
    ) as live:
        with live.client() as client:
            response = client.post("/api/agents/g/run/stream", json={"message": "hi"})
        assert response.status_code == 503
        assert response.json()["error"] == {
            "code": "model_unavailable",
            "message": "Set GEMINI_API_KEY to use gemini-2.5-flash (Google Gemini)",
            "field": "model",
        }
        _, frames = stream_frames(live, "demo", {"message": "hi"})
        assert frames[-1]["event"] == "complete"


def priced_turn(request: ModelRequest) -> list[ModelPart]:
    return [
        TextPart("Hi."),
        UsagePart(Usage(input_tokens=1000, output_tokens=500)),
        TurnEndPart("end_turn"),
    ]


def test_runs_carry_their_cost_into_the_replay(tmp_path: Path) -> None:
    """A model the catalog prices (gpt-4.1-mini: $0.40 in, $1.60 out per million)."""
    model = ScriptedModel("gpt-4.1-mini", priced_turn)
    agents = [AgentSpec(id="priced", model="gpt-4.1-mini")]
    with serve(make_settings(tmp_path), models=[model], agents=agents) as live:
        _, frames = stream_frames(live, "priced", {"message": "hi"})
        with live.client() as client:
            run = client.get(f"/api/agents/runs/{frames[0]['run_id']}").json()
    expected = (1000 * 0.40 + 500 * 1.60) / 1_000_000
    assert frames[-1]["usage"] == {
        "input_tokens": 1000,
        "output_tokens": 500,
        "total_tokens": 1500,
        "cost_usd": pytest.approx(expected),
    }
    assert run["usage"] == frames[-1]["usage"]


def test_models_command_shows_the_registry(server: LiveServer) -> None:
    from typer.testing import CliRunner

    from agentstream.cli import app

    result = CliRunner().invoke(
        app,
        ["models", "--url", server.url, "--key", server.key],
        env={"COLUMNS": "200", "OPENAI_API_KEY": ""},
    )
    assert result.exit_code == 0, result.output
    assert "claude-sonnet-4-5" in result.output
    assert "Set OPENAI_API_KEY to use gpt-4.1" in result.output


def test_closing_the_registry_closes_the_clients_it_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import anyio

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    registry = ModelRegistry(load_catalog())
    clients = [registry.get("gpt-4.1").client, registry.get("claude-sonnet-4-5").client]  # type: ignore[attr-defined]
    assert not any(c.is_closed() for c in clients)
    anyio.run(registry.aclose)
    assert all(c.is_closed() for c in clients)


@pytest.mark.parametrize(
    ("name", "provider", "api_model"),
    [
        ("openai:gpt-4o", "openai", "gpt-4o"),
        ("anthropic:claude-3-5-sonnet-latest", "anthropic", "claude-3-5-sonnet-latest"),
        ("google:gemini-2.0-flash", "gemini", "gemini-2.0-flash"),
        ("gemini:gemini-2.0-flash", "gemini", "gemini-2.0-flash"),
        ("groq:llama-3.1-8b-instant", "groq", "llama-3.1-8b-instant"),
        ("openrouter:meta-llama/llama-3.3-70b", "openrouter", "meta-llama/llama-3.3-70b"),
        ("ollama:llama3.2:3b", "ollama", "llama3.2:3b"),
        ("ollama/mistral", "ollama", "mistral"),
        ("vllm:Qwen/Qwen2.5-7B-Instruct", "vllm", "Qwen/Qwen2.5-7B-Instruct"),
        ("lmstudio:qwen2.5-7b-instruct", "lmstudio", "qwen2.5-7b-instruct"),
    ],
)
def test_provider_model_names_need_no_catalog_entry(
    name: str, provider: str, api_model: str
) -> None:
    registry = ModelRegistry(load_catalog())
    assert name in registry
    info = registry.info(name)
    assert (info.name, info.provider, info.provider_model) == (name, provider, api_model)
    assert info.capabilities is None, "unknown, not guessed"
    assert info.priced(Usage(input_tokens=10, output_tokens=5)).cost_usd is None


def test_a_provider_model_the_catalog_lists_keeps_its_entry() -> None:
    registry = ModelRegistry(load_catalog())
    info = registry.info("openai:gpt-4.1")
    assert (info.name, info.input_price, info.output_price) == ("openai:gpt-4.1", 2.0, 8.0)
    assert info.capabilities is not None
    assert info.capabilities.tools


@pytest.mark.parametrize("name", ["gpt-9-ultra", "nowhere:model", "offline:x", "openai:"])
def test_other_names_are_still_unknown(name: str) -> None:
    assert name not in ModelRegistry(load_catalog())


@pytest.mark.parametrize(
    ("model", "base_url_env", "key_env"),
    [
        ("vllm:my-model", "VLLM_BASE_URL", None),
        ("openai:gpt-4o", "OPENAI_BASE_URL", "OPENAI_API_KEY"),
    ],
)
def test_a_provider_model_agent_runs_through_the_official_sdk(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    base_url_env: str,
    key_env: str | None,
) -> None:
    fake = FakeOpenAI(chat_text("Hello", " there.", usage=(12, 3)))
    with fake.serve() as base_url:
        monkeypatch.setenv(base_url_env, base_url)
        if key_env:
            monkeypatch.setenv(key_env, "sk-test")
        agents = [AgentSpec(id="beyond", model=model)]
        with serve(make_settings(tmp_path), agents=agents) as live:
            _, frames = stream_frames(live, "beyond", {"message": "hi"})
    assert frames[-1]["event"] == "complete"
    assert frames[-1]["content"] == "Hello there."
    assert frames[-1]["usage"] == {
        "input_tokens": 12,
        "output_tokens": 3,
        "total_tokens": 15,
        "cost_usd": None,
    }
    assert fake.received[0][0] == "/v1/chat/completions"
    assert fake.bodies[0]["model"] == model.partition(":")[2]


def test_a_local_server_is_ready_only_when_something_listens(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def ollama() -> dict[str, Any]:
        with server.client() as client:
            listed = {m["model"]["name"]: m for m in client.get("/api/models").json()}
        return dict(listed["ollama/llama3.1"])

    with FakeOpenAI().serve() as base_url:
        monkeypatch.setenv("OLLAMA_BASE_URL", base_url)
        assert (ollama()["available"], ollama()["unavailable_reason"]) == (True, None)
    nothing = f"http://127.0.0.1:{free_port()}/v1"
    monkeypatch.setenv("OLLAMA_BASE_URL", nothing)
    assert ollama()["available"] is False
    assert ollama()["unavailable_reason"] == (
        f"Nothing answers at {nothing} (Ollama (local)): start it, or set OLLAMA_BASE_URL"
    )


def test_reachability_is_remembered_briefly() -> None:
    import anyio

    async def answers(ttl: float) -> tuple[bool, bool]:
        reachability = Reachability(ttl=ttl)
        with FakeOpenAI().serve() as base_url:
            first = await reachability.answers(base_url)
        return first, await reachability.answers(base_url)

    assert anyio.run(answers, 60.0) == (True, True), "remembered within the ttl"
    assert anyio.run(answers, 0.0) == (True, False), "tried again after it"
