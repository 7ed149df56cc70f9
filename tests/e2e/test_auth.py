"""--api-key: the exact 401 body, Bearer and x-api-key, /health public."""

from __future__ import annotations

from typing import Iterator

import httpx
import openai
import pytest

from tests.server import KineticServer

KEY = "segreta123"
UNAUTHORIZED = {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}


@pytest.fixture(scope="module")
def keyed_server(model_lock: None, live_server: KineticServer) -> Iterator[KineticServer]:
    with KineticServer("-c", "1024", "-np", "1", "--api-key", KEY) as server:
        yield server


def test_missing_or_wrong_key_gets_exact_401(keyed_server: KineticServer) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}):
        r = httpx.get(keyed_server.url + "/v1/models", headers=headers)
        assert r.status_code == 401 and r.json() == UNAUTHORIZED


def test_health_stays_public(keyed_server: KineticServer) -> None:
    assert httpx.get(keyed_server.url + "/health").status_code == 200


def test_openai_sdk_without_key_raises_authentication_error(keyed_server: KineticServer) -> None:
    client = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="no-key-required", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        client.chat.completions.create(model="local", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert str(info.value) == f"Error code: 401 - {UNAUTHORIZED}"


def test_bearer_and_x_api_key_both_work(keyed_server: KineticServer) -> None:
    client = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key=KEY, max_retries=0)
    r = client.chat.completions.create(model="local", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.usage.completion_tokens <= 2
    assert httpx.get(keyed_server.url + "/v1/models", headers={"x-api-key": KEY}).status_code == 200
