"""bench/load.py's stream reader, which times the benchmarks' streams: a stream that ends in an error event is a
failure that says which error (a GPU run's class-size table once showed only "1 in-stream error")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from load import _StreamReader  # noqa: E402


def test_a_stream_ended_by_an_error_event_fails_naming_the_error() -> None:
    reader = _StreamReader()
    text = {"choices": [{"text": "a"}]}
    error = {"error": {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}}
    assert reader.line("data: " + json.dumps(text))
    assert not reader.line("data: " + json.dumps(error))
    assert reader.stream_error == "Context size has been exceeded."


def test_a_stream_that_ends_well_is_timed() -> None:
    reader = _StreamReader()
    for line in ["data: " + json.dumps({"choices": [{"text": t}]}) for t in "abc"] + ["", "data: [DONE]"]:
        assert reader.line(line)
    result = reader.result()
    assert result.ok and result.tokens == 3 and reader.stream_error == ""
