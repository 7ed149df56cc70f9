"""Shared fixtures: the live `kinetic serve` on the bundled model and clients pointed at it."""

from __future__ import annotations

from typing import Iterator

import pytest
from filelock import FileLock

from tests.server import MODEL_LOCK_PATH, KineticServer

MODEL_ALIAS = "kinetic-test"
# Two slots of 2048 tokens: enough for every test prompt, small enough to load fast.
DEFAULT_ARGS = ("-c", "4096", "-np", "2", "-a", MODEL_ALIAS, "--embeddings", "--metrics")


@pytest.fixture(scope="session")
def model_lock() -> Iterator[None]:
    with FileLock(str(MODEL_LOCK_PATH)):
        yield


@pytest.fixture(scope="session")
def live_server(model_lock: None) -> Iterator[KineticServer]:
    with KineticServer(*DEFAULT_ARGS) as server:
        yield server


@pytest.fixture(scope="session")
def base_url(live_server: KineticServer) -> str:
    return live_server.url


@pytest.fixture()
def openai_client(live_server: KineticServer):
    from openai import OpenAI

    return OpenAI(base_url=live_server.url + "/v1", api_key="sk-test", max_retries=0, timeout=120)
