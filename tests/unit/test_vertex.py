"""Vertex AI's AIP_* variables and the camelCase names of routes, as llama-server reads them (server-http.cpp
`gcp_params`, `path_to_gcp_format`); the predict route itself is tested on a live server (tests/e2e/test_vertex.py)."""

from __future__ import annotations

import pytest

from kinetic.server.vertex import VertexSettings, VertexSetupError, request_format, vertex_settings


def test_only_prediction_mode_turns_it_on() -> None:
    assert vertex_settings({}) is None
    assert vertex_settings({"AIP_MODE": "TRAINING", "AIP_HTTP_PORT": "9000"}) is None


def test_the_defaults_and_the_leading_slash() -> None:
    assert vertex_settings({"AIP_MODE": "PREDICTION"}) == VertexSettings(port=8080, predict_route="/predict",
                                                                          health_route=None)
    named = vertex_settings({"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "9000", "AIP_PREDICT_ROUTE": "v1/predict",
                             "AIP_HEALTH_ROUTE": "healthz"})
    assert named == VertexSettings(port=9000, predict_route="/v1/predict", health_route="/healthz")
    # an empty variable counts as unset
    empty = vertex_settings({"AIP_MODE": "PREDICTION", "AIP_PREDICT_ROUTE": "", "AIP_HEALTH_ROUTE": ""})
    assert empty is not None and empty.predict_route == "/predict" and empty.health_route is None


def test_a_port_that_is_no_port_is_refused() -> None:
    with pytest.raises(VertexSetupError, match="AIP_HTTP_PORT"):
        vertex_settings({"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "eighty"})


@pytest.mark.parametrize(("path", "name"), [
    ("/v1/chat/completions", "chatCompletions"),
    ("/chat/completions", "chatCompletions"),
    ("/apply-template", "applyTemplate"),
    ("/v1/messages/count_tokens", "messagesCountTokens"),
    ("/slots/{id_slot}", "slots"),
    ("/health", "health"),
    ("/completion", "completion"),
])
def test_routes_by_their_camel_case_names(path: str, name: str) -> None:
    assert request_format(path) == name
