"""Model-free checks of issue 8's native pieces: the infill prompt layout, sampler names and
clamps, embedding normalisation, slot file names, the short generation_settings and /metrics order."""

from __future__ import annotations

import math

import pytest

from kinetic.chat.infill import CHUNK_SEPARATOR, check_fim, infill_tokens
from kinetic.engine.types import EngineStats, GenerationRequest, SamplingParams, sampler_order
from kinetic.errors import InvalidRequestError, NotSupportedError
from kinetic.protocols.common.native import LONG_ONLY
from kinetic.protocols.common.translate import sampling_options
from kinetic.protocols.common.types import SamplingFields
from kinetic.protocols.llamacpp import metrics, server_state, translate

FIM = {"pre": 1001, "suf": 1002, "mid": 1003, "rep": -1, "sep": -1}


def fake_tokenize(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_infill_layout_without_repo_tokens() -> None:
    tokens = infill_tokens(fake_tokenize, FIM, prefix="ab", suffix="cd", extra=(("x.py", "E"),), prompt=[7],
                           n_batch=2048, n_predict=-1, n_ctx=4096, bos=2)
    extra = fake_tokenize(CHUNK_SEPARATOR) + [ord("E")]
    assert tokens == [*extra, 2, 1001, ord("a"), ord("b"), 7, 1002, ord("c"), ord("d"), 1003]


def test_infill_layout_with_repo_tokens_and_limits() -> None:
    fim = {**FIM, "rep": 1004, "sep": 1005}
    tokens = infill_tokens(fake_tokenize, fim, prefix="abcdefgh", suffix="wxyz", extra=(("f", "T"),), prompt=[],
                           n_batch=8, n_predict=0, n_ctx=4096, bos=None)
    repo = [1004, *fake_tokenize("myproject\n"), 1005, *fake_tokenize("f\n"), ord("T"), 1005,
            *fake_tokenize("filename\n")]
    # a batch of 8: the last 6 prefix tokens (3/4), no suffix room left (8/4 - 2 = 0)
    assert tokens == [*repo, 1001, *fake_tokenize("cdefgh"), 1002, 1003]


def test_check_fim_names_only_what_is_missing() -> None:
    check_fim(FIM)
    with pytest.raises(NotSupportedError) as err:
        check_fim({"pre": 5, "suf": -1, "mid": -1})
    assert err.value.message == ("Infill is not supported by this model: suffix token is missing. "
                                 "middle token is missing. ")


def test_sampler_names_any_spelling_and_codes() -> None:
    assert sampler_order(["Top-K", "temp", "nucleus", "typical", "minp", "bogus", "XTC"]) == (
        "top_k", "temperature", "top_p", "typ_p", "min_p", "xtc")
    assert sampler_order("edkypmxt") == ("penalties", "dry", "top_k", "typ_p", "top_p", "min_p", "xtc",
                                         "temperature")
    assert sampler_order(None) is None and sampler_order([]) == ()


def test_sampling_options_clamp_and_refuse_as_llama_server() -> None:
    options = sampling_options(SamplingFields(mirostat=5, xtc_probability=-1.0, xtc_threshold=2.0, dry_base=0.3,
                                              dry_sequence_breakers=["\n"], adaptive_target=3.0))
    assert options.chosen == {"mirostat": 2, "xtc_probability": 0.0, "xtc_threshold": 1.0,  # dry_base < 1: default
                              "dry_sequence_breakers": ("\n",), "adaptive_target": 1.0}
    for bad in ({"dry_sequence_breakers": "x"}, {"dry_allowed_length": -1}, {"min_keep": -3},
                {"adaptive_decay": 1.0}):
        with pytest.raises(InvalidRequestError) as err:
            sampling_options(SamplingFields(**bad))
        assert err.value.param == next(iter(bad))


@pytest.mark.parametrize(("mode", "check"), [
    (-1, lambda v: v == [3.0, -4.0]),
    (0, lambda v: math.isclose(max(abs(x) for x in v), 32760.0)),
    (1, lambda v: math.isclose(sum(abs(x) for x in v), 1.0)),
    (2, lambda v: math.isclose(math.hypot(*v), 1.0)),
    (3, lambda v: math.isclose(sum(abs(x) ** 3 for x in v), 1.0)),
])
def test_embedding_normalisation(mode: int, check) -> None:
    assert check(translate.normalize([3.0, -4.0], mode))


def test_native_embeddings_keep_per_token_vectors_raw() -> None:
    vectors = [[[3.0, 4.0], [1.0, 0.0]]]
    assert translate.to_native_embeddings(vectors, pooling="none", embd_normalize=2) == [
        {"index": 0, "embedding": [[3.0, 4.0], [1.0, 0.0]]}]
    [pooled] = translate.to_native_embeddings([[[3.0, 4.0]]], pooling="mean", embd_normalize=2)
    assert pooled["index"] == 0 and pooled["embedding"] == [pytest.approx([0.6, 0.8])]


@pytest.mark.parametrize("name", ["", "../x.bin", "a/b.bin", ".hidden", "x" * 300, "a\\b", "nul\x00"])
def test_bad_slot_file_names(name: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        server_state.slot_filename(name)
    assert err.value.message == "Invalid filename"


def test_good_slot_file_name() -> None:
    assert server_state.slot_filename("slot-1.bin") == "slot-1.bin"


def test_short_generation_settings_drop_the_long_only_keys() -> None:
    request = GenerationRequest(prompt_tokens=[1], sampling=SamplingParams(), max_tokens=5)
    long, short = translate.generation_settings(request), translate.generation_settings(request, short=True)
    assert set(long) - set(short) == set(LONG_ONLY)
    assert short["n_predict"] == short["max_tokens"] == 5


def test_metrics_counters_then_gauges() -> None:
    text = metrics.metrics_text(EngineStats(counters={"n_decode_total": 4}, requests_processing=1,
                                              requests_deferred=0, gauges={"n_busy_slots_per_decode": 1.5}))
    kinds = [line.split()[3] for line in text.splitlines() if line.startswith("# TYPE")]
    assert kinds[:15] == ["counter"] * 10 + ["gauge"] * 5
    assert "llamacpp:n_busy_slots_per_decode 1.5" in text and "llamacpp:n_decode_total 4" in text
