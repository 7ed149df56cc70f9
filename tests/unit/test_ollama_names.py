"""Ollama's model-name grammar (kinetic/protocols/ollama/names.py), case by case against Ollama's rules
(types/model/name.go): the parts a name splits into, and which names are refused."""

from __future__ import annotations

import pytest

from kinetic.errors import InvalidRequestError
from kinetic.protocols.ollama.names import OllamaName, check_name, is_valid_name, parse_name


@pytest.mark.parametrize(("name", "parts"), [
    ("mistral", ("registry.ollama.ai", "library", "mistral", "latest")),
    ("mistral:7b", ("registry.ollama.ai", "library", "mistral", "7b")),
    ("lab/tutor:v1", ("registry.ollama.ai", "lab", "tutor", "v1")),
    ("hf.co/ggml-org/Qwen3.5-0.8B-GGUF:Q4_K_M", ("hf.co", "ggml-org", "Qwen3.5-0.8B-GGUF", "Q4_K_M")),
    ("https://hf.co/owner/repo", ("hf.co", "owner", "repo", "latest")),
    ("localhost:5000/ns/model:tag", ("localhost:5000", "ns", "model", "tag")),  # a ':' before the last '/'
    ("../escaped", ("registry.ollama.ai", "..", "escaped", "latest")),
    ("model:", ("registry.ollama.ai", "library", "model", "")),  # promised by ':', then empty
])
def test_a_name_splits_into_ollamas_parts_with_its_defaults(name: str, parts: tuple[str, ...]) -> None:
    assert parse_name(name) == OllamaName(*parts)


@pytest.mark.parametrize("name", [
    "gemma", "gemma-3-270m-q4_k_m", "tutor-copy", "_private", "a.b", "9lives:2.0", "lab/tutor:v1",
    "hf.co/test-org/tiny-gemma-GGUF:Q8_0", "http://example.com/ns/model:tag", "localhost:5000/ns/m",
    "m" * 80, "m:" + "t" * 80, "h" * 350 + "/ns/m",
])
def test_names_ollama_takes(name: str) -> None:
    assert is_valid_name(name)
    assert check_name(name, "model") == name


@pytest.mark.parametrize("name", [
    "",  # no model
    "../escaped", "..", "a/../b",  # a namespace (or model) of dots: the path-escape case
    "/model", "ns/", ":tag", "model:", "ns//model",  # a part promised by its separator, then empty
    "-model", ".model", "model/.hidden", "ns/model:-tag",  # a part must start with a letter, digit or '_'
    "ns.x/model",  # no '.' in a namespace
    "a b", "tutor!", "módel", "model:ta g", "x\n",  # bytes outside the grammar
    "model:tag:x", "ns:x/model", "a/b/c/d",  # ':' only in a host, '/' in none
    "m" * 81, "m:" + "t" * 81, "n" * 81 + "/m", "h" * 351 + "/ns/m",  # lengths: 80 a part, 350 a host
])
def test_names_ollama_refuses_are_a_400_naming_the_field(name: str) -> None:
    assert not is_valid_name(name)
    with pytest.raises(InvalidRequestError) as refused:
        check_name(name, "destination")
    assert refused.value.status == 400 and refused.value.param == "destination"
    assert refused.value.message.startswith(f'destination "{name}" is invalid')
