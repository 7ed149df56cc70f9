"""Vertex AI's custom-container contract, as llama-server has it (AIP_MODE=PREDICTION): the port from
AIP_HTTP_PORT, the health route from AIP_HEALTH_ROUTE, and AIP_PREDICT_ROUTE's `{"instances": [...]}`, each
instance sent to the route its `@requestFormat` names. Mirrors llama.cpp's tools/server/tests/unit/
test_compat_gcp.py (camelCase chatCompletions, several instances at once) on a keyed server with a ledger,
started with the variables set for its process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kinetic.classroom.ledger import read_ledger
from tests.server import KineticServer, free_port, wait_until

pytestmark = pytest.mark.e2e

STUDENT, ADMIN = "sk-vertex-student", "sk-vertex-admin"
PREDICT, HEALTH = "/vertex/predict", "/vertex/health"


@pytest.fixture(scope="module")
def served(model_lock: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KineticServer, Path]]:
    folder = tmp_path_factory.mktemp("vertex")
    keys = folder / "keys.txt"
    keys.write_text(f"{STUDENT} vera\n")
    ledger = folder / "ledger.jsonl"
    # --port names another port: AIP_HTTP_PORT wins, as in llama-server
    server = KineticServer("-c", "2048", "-np", "2", "-n", "8", "-a", "vertex-gemma", "--api-key-file", str(keys),
                           "--admin-key", ADMIN, "--ledger", str(ledger), "--port", str(free_port()))
    server.env.update({"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(server.port),
                       "AIP_PREDICT_ROUTE": PREDICT.lstrip("/"), "AIP_HEALTH_ROUTE": HEALTH})
    with server:
        yield server, ledger


def predict(server: KineticServer, body: Any, key: str = STUDENT) -> httpx.Response:
    return httpx.post(server.url + PREDICT, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def chat_instance(text: str, **fields: Any) -> dict[str, Any]:
    return {"@requestFormat": "chatCompletions", "max_tokens": 8, "messages": [{"role": "user", "content": text}],
            **fields}


def test_the_port_and_the_health_route_come_from_the_environment(served: tuple[KineticServer, Path]) -> None:
    server = served[0]
    health = httpx.get(server.url + HEALTH, headers={"Authorization": f"Bearer {STUDENT}"}, timeout=10)
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    # like any route but /health and /v1/health, the health route is behind the key, as in llama-server
    assert httpx.get(server.url + HEALTH, timeout=10).status_code == 401
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    assert predict(server, {"instances": []}, key="sk-wrong").status_code == 401
    # the predict route is AIP_PREDICT_ROUTE (a leading slash added), not /predict
    assert httpx.post(server.url + "/predict", json={"instances": []},
                      headers={"Authorization": f"Bearer {STUDENT}"}, timeout=10).status_code == 404


def test_predict_camel_case_chat_completion(served: tuple[KineticServer, Path]) -> None:
    """test_compat_gcp.py's test_gcp_predict_camel_case."""
    response = predict(served[0], {"instances": [chat_instance("What is the meaning of life?")]})
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert len(predictions) == 1
    choice, = predictions[0]["choices"]
    assert choice["message"]["role"] == "assistant" and len(choice["message"]["content"]) > 0
    assert predictions[0]["object"] == "chat.completion"


def test_predict_several_instances_in_order(served: tuple[KineticServer, Path]) -> None:
    """test_compat_gcp.py's test_gcp_predict_multiple_instances, plus a path, a GET route and a stream asked for."""
    response = predict(served[0], {"instances": [
        chat_instance("Say hello"),
        chat_instance("Say world", stream=True),  # never streamed: the whole answer comes back
        {"@requestFormat": "/v1/completions", "prompt": "Once upon a time", "max_tokens": 4},
        {"@requestFormat": "tokenize", "content": "hello world"},
        {"@requestFormat": "models"},
    ]})
    assert response.status_code == 200, response.text
    chat, streamed, completion, tokens, models = response.json()["predictions"]
    for prediction in (chat, streamed):
        assert len(prediction["choices"][0]["message"]["content"]) > 0
    assert completion["object"] == "text_completion" and completion["usage"]["completion_tokens"] == 4
    assert isinstance(tokens["tokens"], list) and len(tokens["tokens"]) >= 2
    assert models["data"][0]["id"] == "vertex-gemma"


def test_a_failing_instance_is_an_error_body_among_the_predictions(served: tuple[KineticServer, Path]) -> None:
    response = predict(served[0], {"instances": [
        "not an object",
        {"max_tokens": 4},
        {"@requestFormat": "noSuchRoute"},
        chat_instance("hello", max_tokens=0),  # the route's own 400
        {"@requestFormat": "slots/{id_slot}", "action": "erase"},  # no such literal path
        chat_instance("still answered"),
    ]})
    assert response.status_code == 200, response.text
    *errors, answered = response.json()["predictions"]
    messages = [error["error"]["message"] for error in errors]
    assert messages[0] == "each instance must be a JSON object"
    assert messages[1] == "each instance must include a string @requestFormat"
    assert messages[2] == "no handler registered for @requestFormat: noSuchRoute"
    assert errors[3]["error"]["code"] == 400 and errors[3]["error"]["param"] == "max_tokens"
    assert all(error["error"]["type"] == "invalid_request_error" for error in errors)
    assert answered["choices"][0]["message"]["role"] == "assistant"


def test_an_admin_route_is_the_admins_through_predict_too(served: tuple[KineticServer, Path]) -> None:
    load = {"@requestFormat": "/models/load", "model": "vertex-gemma"}
    refused, = predict(served[0], {"instances": [load]}).json()["predictions"]
    assert refused["error"]["code"] == 403
    allowed, = predict(served[0], {"instances": [load]}, key=ADMIN).json()["predictions"]
    assert "error" not in allowed or allowed["error"]["code"] != 403


def test_a_bad_predict_body_is_a_400(served: tuple[KineticServer, Path]) -> None:
    server = served[0]
    not_json = httpx.post(server.url + PREDICT, content=b"{", headers={"Authorization": f"Bearer {STUDENT}",
                                                                        "Content-Type": "application/json"})
    assert not_json.status_code == 400
    assert predict(server, [1, 2]).json()["error"]["message"] == "request body must be a JSON object"
    missing = predict(server, {"instance": []})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "instances"
    too_many = predict(server, {"instances": [{}] * 129})
    assert too_many.status_code == 400 and "128" in too_many.json()["error"]["message"]


def test_the_ledger_writes_one_line_that_adds_up_the_instances(served: tuple[KineticServer, Path]) -> None:
    server, ledger = served
    response = predict(server, {"instances": [chat_instance("one"), chat_instance("two", max_tokens=3)]})
    assert response.status_code == 200
    first, second = response.json()["predictions"]
    prompt = first["usage"]["prompt_tokens"] + second["usage"]["prompt_tokens"]
    completion = first["usage"]["completion_tokens"] + second["usage"]["completion_tokens"]

    def lines() -> list[Any]:
        return [r for r in read_ledger(ledger) if r.route == PREDICT and r.status == 200
                and r.prompt_tokens == prompt and r.completion_tokens == completion]

    wait_until(lambda: bool(lines()), "the predict request's ledger line", timeout=10)
    assert lines()[-1].client == "vera"
    assert not [r for r in read_ledger(ledger) if r.route == "/v1/chat/completions"]  # no line per instance


def test_a_predict_route_that_is_already_a_route_stops_the_server() -> None:
    env = {"AIP_MODE": "PREDICTION", "AIP_PREDICT_ROUTE": "/health", "AIP_HTTP_PORT": str(free_port())}
    started = subprocess.run([sys.executable, "-m", "kinetic", "serve", "--host", "127.0.0.1"],
                             env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert started.returncode == 1
    assert "AIP_PREDICT_ROUTE=/health conflicts with an existing route" in started.stderr
