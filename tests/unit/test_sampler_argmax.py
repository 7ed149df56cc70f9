"""The greedy shortcut against llama.cpp's own chain: for every configuration `reduces_to_argmax`
accepts, `argmax_biased` must pick the token llama-server's chain (logit bias, the default samplers,
temperature 0, the random pick) picks, on logits where a bias bans or lifts the top tokens."""

from __future__ import annotations

import ctypes
from dataclasses import replace

import llama_cpp
import numpy as np
import pytest

from kinetic.engine.llama.sampler import TOKEN_DATA, argmax_biased, quick_to_build, reduces_to_argmax
from kinetic.engine.types import SamplingParams

N_VOCAB = 4096
GREEDY = SamplingParams(temperature=0.0)


def chain_pick(logits: np.ndarray, bias: dict[int, float], p: SamplingParams, seed: int) -> int:
    """What llama.cpp's chain, built as llama-server builds it from `p`, picks from `logits`."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    try:
        if bias:
            entries = (llama_cpp.llama_logit_bias * len(bias))(
                *[llama_cpp.llama_logit_bias(token=t, bias=b) for t, b in bias.items()])
            llama_cpp.llama_sampler_chain_add(chain,
                                              llama_cpp.llama_sampler_init_logit_bias(N_VOCAB, len(bias), entries))
        builders = {
            "penalties": lambda: llama_cpp.llama_sampler_init_penalties(
                N_VOCAB, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty),
            "top_n_sigma": lambda: llama_cpp.llama_sampler_init_top_n_sigma(p.top_n_sigma),
            "top_k": lambda: llama_cpp.llama_sampler_init_top_k(p.top_k),
            "typ_p": lambda: llama_cpp.llama_sampler_init_typical(p.typical_p, p.min_keep),
            "top_p": lambda: llama_cpp.llama_sampler_init_top_p(p.top_p, p.min_keep),
            "min_p": lambda: llama_cpp.llama_sampler_init_min_p(p.min_p, p.min_keep),
            "xtc": lambda: llama_cpp.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, p.min_keep, seed),
            "temperature": lambda: llama_cpp.llama_sampler_init_temp_ext(
                p.temperature, p.dynatemp_range, p.dynatemp_exponent),
        }
        for name in p.samplers:
            if name in builders:
                llama_cpp.llama_sampler_chain_add(chain, builders[name]())
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(seed))
        data = np.empty(N_VOCAB, dtype=TOKEN_DATA)
        data["id"] = np.arange(N_VOCAB, dtype=np.int32)
        data["logit"] = logits
        data["p"] = 0.0
        array = llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), size=N_VOCAB, selected=-1,
            sorted=False)
        llama_cpp.llama_sampler_apply(chain, ctypes.byref(array))
        return int(array.data[array.selected].id)  # XTC moves `data` past the tokens it drops
    finally:
        llama_cpp.llama_sampler_free(chain)


def shortcut_pick(logits: np.ndarray, bias: dict[int, float]) -> int:
    return argmax_biased(logits, np.fromiter(bias, dtype=np.int64, count=len(bias)),
                         np.fromiter(bias.values(), dtype=np.float32, count=len(bias)))


ACCEPTED = [
    GREEDY,
    replace(GREEDY, repeat_penalty=1.0, repeat_last_n=0, frequency_penalty=0.0),
    replace(GREEDY, top_k=1, top_p=0.5, min_p=0.3, top_n_sigma=1.0),
    replace(GREEDY, xtc_probability=1.0, xtc_threshold=0.6),  # a threshold over 0.5 turns XTC off
    replace(GREEDY, repeat_penalty=1.3, repeat_last_n=0),  # a window of 0 turns the penalties off
    replace(GREEDY, samplers=("temperature", "xtc", "typ_p")),  # after temperature 0 one token is left
]


@pytest.mark.parametrize("params", ACCEPTED)
def test_the_shortcut_picks_what_the_chain_picks(params: SamplingParams) -> None:
    assert reduces_to_argmax(params)
    rng = np.random.default_rng(7)
    for trial in range(60):
        logits = (rng.standard_normal(N_VOCAB) * 4).astype(np.float32)
        order = np.argsort(-logits)
        bias: dict[int, float] = {}
        if trial % 3 == 1:  # ban the top tokens, as ignore_eos bans end-of-generation
            bias = {int(t): float("-inf") for t in order[:3]}
        elif trial % 3 == 2:  # lift a low token over the top, push another down
            bias = {int(order[500]): 30.0, int(order[1]): -1.0, int(order[0]): -0.5}
        assert shortcut_pick(logits, bias) == chain_pick(logits, bias, params, seed=trial), (trial, bias)


REFUSED = [
    replace(GREEDY, temperature=0.1),
    replace(GREEDY, dynatemp_range=0.5),
    replace(GREEDY, mirostat=2),
    replace(GREEDY, repeat_penalty=1.1),
    replace(GREEDY, presence_penalty=0.5),
    replace(GREEDY, dry_multiplier=0.8),
    replace(GREEDY, typical_p=0.5),
    replace(GREEDY, xtc_probability=0.5, xtc_threshold=0.1),
    replace(GREEDY, samplers=("top_k",)),  # no temperature: the random pick among the top k
    replace(GREEDY, samplers=("infill", "temperature")),
    replace(GREEDY, adaptive_target=0.5, samplers=("temperature", "adaptive_p")),
]


@pytest.mark.parametrize("params", REFUSED)
def test_a_chain_that_can_move_the_top_token_keeps_the_chain(params: SamplingParams) -> None:
    assert not reduces_to_argmax(params)


def test_the_refused_chains_do_move_the_top_token() -> None:
    # Why the refusals matter: XTC on, a low temperature, typical-p each pick another token here.
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal(N_VOCAB) * 0.5).astype(np.float32)
    logits[:2] = [9.0, 8.99]
    for params in (replace(GREEDY, xtc_probability=1.0, xtc_threshold=0.01), replace(GREEDY, typical_p=0.2)):
        picks = {chain_pick(logits, {}, params, seed) for seed in range(20)}
        assert picks != {0}, params


def test_a_tie_resolves_to_the_lower_id() -> None:
    logits = np.zeros(N_VOCAB, dtype=np.float32)
    logits[[40, 7]] = 3.0
    assert shortcut_pick(logits, {}) == 7
    assert shortcut_pick(logits, {7: float("-inf")}) == 40
    assert shortcut_pick(logits, {9: 3.0}) == 7  # 9 ties at 3.0 and loses to the lower id
    assert shortcut_pick(logits, {3: 3.0}) == 3


@pytest.mark.parametrize(("params", "n_prompt", "quick"), [
    (SamplingParams(), 20_000, True),  # the penalties read only their last 64 tokens
    (SamplingParams(grammar='root ::= "a"'), 10, False),  # a grammar is parsed on a worker thread
    (SamplingParams(repeat_last_n=-1), 400, True),
    (SamplingParams(repeat_last_n=-1), 20_000, False),  # the whole prompt fed to the penalties
    (SamplingParams(repeat_last_n=-1, samplers=("top_k", "temperature")), 20_000, True),  # no penalties in the chain
    (SamplingParams(dry_multiplier=0.8, dry_penalty_last_n=4096), 20_000, False),
    (SamplingParams(dry_multiplier=0.0, dry_penalty_last_n=4096), 20_000, True),  # DRY off: nothing fed
])
def test_a_sampler_quick_to_build_is_built_on_the_event_loop(params: SamplingParams, n_prompt: int,
                                                               quick: bool) -> None:
    assert quick_to_build(params, n_prompt) is quick
