"""The request gate on a real app whose model has not loaded yet (no lifespan has run)."""

from pathlib import Path

from fastapi.testclient import TestClient

from kinetic.config.settings import ServerSettings
from kinetic.engine.llama import LlamaEngine
from tests.scripted import single_model_app

LOADING = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}


def app_client(**settings: object) -> TestClient:
    engine = LlamaEngine(Path("unused.gguf"))
    app = single_model_app(ServerSettings(**settings), engine)
    return TestClient(app)  # not entered: the model never loads


def test_everything_is_503_while_loading_even_health() -> None:
    client = app_client(api_key="k")
    for path in ("/health", "/v1/models"):
        r = client.get(path)
        assert r.status_code == 503 and r.json() == LOADING


def test_options_preflight_is_200_with_cors() -> None:
    r = app_client().options("/v1/chat/completions", headers={"Origin": "http://example.org",
                                                             "Access-Control-Request-Method": "POST"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://example.org"
    assert "POST" in r.headers["access-control-allow-methods"]


def test_cors_localhost_only() -> None:
    client = app_client(cors_origins="localhost")
    assert client.options("/x", headers={"Origin": "http://localhost:3000"}).headers[
        "access-control-allow-origin"] == "http://localhost:3000"
    assert "access-control-allow-origin" not in client.options("/x", headers={"Origin": "http://evil.example"}).headers
