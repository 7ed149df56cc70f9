"""The sampler chain a request's SamplingParams turn into, and the log-probabilities it reports.

The chain is built the way llama.cpp's common_sampler_init builds llama-server's: the logit bias,
then either the `samplers` list in its order followed by the random pick (`dist`), or, with
`mirostat` 1 or 2, temperature and Mirostat alone.

A grammar stays outside the chain and is applied the way llama-server's common_sampler_sample
applies it: the chain picks a token from the raw logits, the grammar checks that one token, and
only when it is refused is the whole vocabulary filtered by the grammar and the chain run again.
Filtering 262k candidates through a grammar costs more than the decode step itself on a small
model, and most steps of constrained output need no filtering at all.

Greedy requests (temperature 0 with nothing in the chain that can move or drop the top token) skip
the chain: its pick is then the highest biased logit, which one argmax over the logits finds. The
chain would first copy all 262k logits into candidates and sort out the top 40, about 0.15 ms a
token, 1.5% of a decode step of the bundled model, spent by llama-server on every greedy token.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import _internals

from kinetic.engine.llama.model import LoadedModel
from kinetic.engine.types import SamplingParams, TokenLogprob, TokenProb
from kinetic.errors import InvalidRequestError

# llama_token_data as numpy sees it (id int32, logit float, p float), for the post-sampling path.
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
MIROSTAT_M = 100  # llama-server's fixed m for Mirostat 1


# Most prompt tokens a sampler built on the event loop may read into its penalties (a few microseconds each);
# beyond that, or with a grammar to parse, it is built on a worker thread.
INLINE_FEED_TOKENS = 512


def quick_to_build(params: SamplingParams, n_prompt: int) -> bool:
    """Whether a request's sampler costs so little to build (no grammar to parse, a short penalty window)
    that handing it to a worker thread and back would cost more: that hop took ~0.3 ms of a one-stream
    TTFT of ~9 ms on a tiny model (2026-12-05, 2 cores)."""
    windows = [params.repeat_last_n if "penalties" in params.samplers else 0,
               params.dry_penalty_last_n if "dry" in params.samplers and params.dry_multiplier else 0]
    fed = n_prompt if any(w < 0 for w in windows) else min(n_prompt, max(windows))
    return not params.grammar and fed <= INLINE_FEED_TOKENS


class GrammarDeadEnd(Exception):
    """No token both obeys the grammar and survives the chain (ignore_eos or a logit_bias removed
    all the grammar allows). llama.cpp's grammar throws a C++ exception, which would abort the whole
    process, if the token were accepted anyway. `complete`: the grammar's output is whole (it allows
    an end-of-generation token), so the request can simply stop."""

    def __init__(self, complete: bool):
        super().__init__("no token obeys the grammar and the sampler's logit_bias/ignore_eos at once")
        self.complete = complete


class Sampler:
    """One request's llama.cpp sampler chain; `sample` picks the next token from a row of logits."""

    def __init__(self, model: LoadedModel, params: SamplingParams, prompt_tokens: list[int] | None = None):
        self.model = model
        self._params = params
        self._chain: _internals.LlamaSampler | None = None  # built on first use by a greedy request (`chain`)
        self._keep: list[Any] = []  # ctypes arrays the samplers point into
        self._history: list[int] = []  # chain indexes of samplers that remember tokens (penalties, DRY)
        self._history_n = 0  # how many past tokens they look at (-1: all)
        self.grammar: Any = None  # llama_sampler pointer, outside the chain (see the module's docstring)
        self._candidates: np.ndarray | None = None  # reused llama_token_data buffer (grammar, post_sampling_probs)
        self._argmax = reduces_to_argmax(params)  # the chain's pick is always the highest biased logit
        self._bias = dict(params.logit_bias)
        if params.ignore_eos:
            self._bias.update({token: float("-inf") for token in model.eog_tokens})
        self._bias_ids = np.fromiter(self._bias.keys(), dtype=np.int64, count=len(self._bias))
        self._bias_values = np.fromiter(self._bias.values(), dtype=np.float32, count=len(self._bias))
        try:
            if params.grammar:
                self.grammar = llama_cpp.llama_sampler_init_grammar(model.vocab, params.grammar.encode("utf-8"),
                                                                    b"root")
                if not self.grammar:
                    raise InvalidRequestError("Failed to initialize samplers: failed to parse grammar",
                                              param="grammar")
            # A greedy request's picks never go through the chain, and its penalties (neutral, or none) remember
            # nothing that matters: its chain waits until post_sampling_probs or a grammar's refusal asks for it
            # (~0.15 ms of ctypes calls on the event loop before every greedy request was queued).
            if not self._argmax:
                self._build()
                if prompt_tokens:
                    self.feed_prompt(prompt_tokens)
        except BaseException:
            self.close()
            raise

    @property
    def chain(self) -> _internals.LlamaSampler:
        if self._chain is None:
            self._build()
            assert self._chain is not None
        return self._chain

    def _add(self, sampler: Any) -> int:
        llama_cpp.llama_sampler_chain_add(self.chain.sampler, sampler)
        return llama_cpp.llama_sampler_chain_n(self.chain.sampler) - 1

    def _build(self) -> None:
        model, params = self.model, self._params
        self._chain = _internals.LlamaSampler()
        n_vocab = model.n_vocab
        if self._bias:
            self._chain.add_logit_bias(n_vocab, self._bias)
        seed = params.seed if params.seed >= 0 else llama_cpp.LLAMA_DEFAULT_SEED
        if params.mirostat == 1:
            self._add(llama_cpp.llama_sampler_init_temp(params.temperature))
            self._add(llama_cpp.llama_sampler_init_mirostat(n_vocab, seed, params.mirostat_tau, params.mirostat_eta,
                                                            MIROSTAT_M))
            return
        if params.mirostat == 2:
            self._add(llama_cpp.llama_sampler_init_temp(params.temperature))
            self._add(llama_cpp.llama_sampler_init_mirostat_v2(seed, params.mirostat_tau, params.mirostat_eta))
            return
        builders = self._builders(model, params, seed)
        for name in params.samplers:
            if name in builders:
                builders[name]()
        if "adaptive_p" in params.samplers and params.adaptive_target >= 0:
            self._add(llama_cpp.llama_sampler_init_adaptive_p(params.adaptive_target, params.adaptive_decay, seed))
        else:
            self._add(llama_cpp.llama_sampler_init_dist(seed))

    def _builders(self, model: LoadedModel, p: SamplingParams, seed: int) -> dict[str, Callable[[], object]]:
        def penalties() -> None:
            self._history.append(self._add(llama_cpp.llama_sampler_init_penalties(
                model.n_vocab, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty)))
            self._remember(p.repeat_last_n)

        def dry() -> None:
            if p.dry_multiplier == 0.0:  # llama.cpp's DRY is a no-op then; skip its bookkeeping
                return
            breakers = (ctypes.c_char_p * len(p.dry_sequence_breakers))(
                *[b.encode("utf-8") for b in p.dry_sequence_breakers])
            self._keep.append(breakers)
            self._history.append(self._add(llama_cpp.llama_sampler_init_dry(
                model.vocab, p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n, breakers,
                len(p.dry_sequence_breakers))))
            self._remember(p.dry_penalty_last_n)

        return {
            "penalties": penalties,
            "dry": dry,
            "top_n_sigma": lambda: self._add(llama_cpp.llama_sampler_init_top_n_sigma(p.top_n_sigma)),
            "top_k": lambda: self._add(llama_cpp.llama_sampler_init_top_k(p.top_k)),
            "typ_p": lambda: self._add(llama_cpp.llama_sampler_init_typical(p.typical_p, p.min_keep)),
            "top_p": lambda: self._add(llama_cpp.llama_sampler_init_top_p(p.top_p, p.min_keep)),
            "min_p": lambda: self._add(llama_cpp.llama_sampler_init_min_p(p.min_p, p.min_keep)),
            "xtc": lambda: self._add(llama_cpp.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold,
                                                                     p.min_keep, seed)),
            "temperature": lambda: self._add(llama_cpp.llama_sampler_init_temp_ext(
                p.temperature, p.dynatemp_range, p.dynatemp_exponent)),
            "infill": lambda: self._add(llama_cpp.llama_sampler_init_infill(model.vocab)),
        }

    def _remember(self, last_n: int) -> None:
        self._history_n = -1 if last_n < 0 or self._history_n < 0 else max(self._history_n, last_n)

    def feed_prompt(self, tokens: list[int]) -> None:
        """The prompt's tokens count as history for the penalties and DRY, as in llama-server
        (which accepts every prompt token into its sampler, never into the grammar). Both keep a
        window of their last_n tokens, so feeding that window gives the same state as feeding all."""
        if not self._history:
            return
        window = tokens if self._history_n < 0 else tokens[-self._history_n:] if self._history_n else []
        samplers = [llama_cpp.llama_sampler_chain_get(self.chain.sampler, i) for i in self._history]
        for token in window:
            for sampler in samplers:
                llama_cpp.llama_sampler_accept(sampler, token)

    def sample(self, ctx: _internals.LlamaContext, row: int) -> int:
        if self._argmax:
            token = argmax_biased(logits_row(ctx, row, self.model.n_vocab), self._bias_ids, self._bias_values)
        elif self.grammar is None:
            return int(llama_cpp.llama_sampler_sample(self.chain.sampler, ctx.ctx, row))
        else:
            array = self._fill(ctx, row)
            llama_cpp.llama_sampler_apply(self.chain.sampler, ctypes.byref(array))
            token = int(array.data[array.selected].id)
        if self.grammar is not None and not self._grammar_allows(token):
            array = self._fill(ctx, row)
            llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(array))
            llama_cpp.llama_sampler_apply(self.chain.sampler, ctypes.byref(array))
            token = int(array.data[array.selected].id)
            self._require_grammar_allows(token)
        self._accept(token)
        return int(token)

    def _require_grammar_allows(self, token: int) -> None:
        """After the grammar filtered the vocabulary: the chain may still have picked a token it
        refused, when none it allows survived the chain."""
        if not self._grammar_allows(token):
            raise GrammarDeadEnd(complete=any(self._grammar_allows(t) for t in self.model.eog_tokens))

    def _accept(self, token: int) -> None:
        """`token` obeys the grammar (checked): the grammar and the chain's memories take it (a
        chain that reduces to argmax remembers nothing that could change a pick)."""
        if self.grammar is not None:
            llama_cpp.llama_sampler_accept(self.grammar, token)
        if not self._argmax:
            llama_cpp.llama_sampler_accept(self.chain.sampler, token)

    def _fill(self, ctx: _internals.LlamaContext, row: int) -> llama_cpp.llama_token_data_array:
        """Every token of the vocabulary with its logit, as llama_sampler_sample starts from."""
        n_vocab = self.model.n_vocab
        if self._candidates is None:
            self._candidates = np.empty(n_vocab, dtype=TOKEN_DATA)
        data = self._candidates
        data["id"] = self.model.token_ids
        data["logit"] = logits_row(ctx, row, n_vocab)
        data["p"] = 0.0
        return llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), size=n_vocab, selected=-1,
            sorted=False)

    def _grammar_allows(self, token: int) -> bool:
        single = llama_cpp.llama_token_data(id=token, logit=1.0, p=0.0)
        array = llama_cpp.llama_token_data_array(data=ctypes.pointer(single), size=1, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(array))
        return not math.isinf(single.logit)

    def sample_with_candidates(self, ctx: _internals.LlamaContext, row: int, n_probs: int) -> tuple[int, TokenLogprob]:
        """The token, and the chain's surviving candidates with their probabilities (llama-server's
        `post_sampling_probs`): what llama_sampler_sample does, with the candidate array kept."""
        array = self._fill(ctx, row)
        data = self._candidates
        assert data is not None
        if self.grammar is not None:  # the candidates shown must all obey it: filter first here
            llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(array))
        llama_cpp.llama_sampler_apply(self.chain.sampler, ctypes.byref(array))
        # XTC drops the top tokens by moving the array's start: read from where it now points.
        first = ctypes.addressof(array.data.contents)  # type: ignore[attr-defined]  # a pointer, typed as an array
        start = (first - data.ctypes.data) // TOKEN_DATA.itemsize
        candidates = data[start: start + array.size]
        token = int(candidates[array.selected]["id"])
        if self.grammar is not None:
            self._require_grammar_allows(token)
        self._accept(token)
        probs = candidates["p"].astype(np.float64)
        order = np.argsort(-probs, kind="stable")
        chosen_p = float(probs[array.selected])
        top = [(int(candidates[i]["id"]), float(probs[i])) for i in order[:n_probs] if probs[i] > 0]
        chosen = _token_prob(self.model, token, _log(chosen_p))
        return token, TokenLogprob(id=chosen.id, token=chosen.token, bytes=chosen.bytes, logprob=chosen.logprob,
                                   top_logprobs=[_token_prob(self.model, t, _log(p)) for t, p in top])

    def close(self) -> None:
        if self.grammar is not None:
            llama_cpp.llama_sampler_free(self.grammar)
            self.grammar = None
        if self._chain is not None:
            self._chain.close()
            self._chain = None


# Samplers that never drop or demote the top token when configured as allowed below; run before a
# temperature of 0 (which keeps only the top token), the chain then picks the highest logit.
_KEEPS_TOP = {"top_n_sigma", "top_k", "top_p", "min_p"}


def reduces_to_argmax(p: SamplingParams) -> bool:
    """Whether the chain built from `p` always picks the token with the highest (biased) logit.

    Exact ties between top logits are the one difference: llama.cpp's top_k may leave either first,
    the argmax takes the lower id."""
    if p.mirostat != 0 or p.temperature > 0 or p.dynatemp_range > 0 or "temperature" not in p.samplers:
        return False
    if "adaptive_p" in p.samplers and p.adaptive_target >= 0:
        return False
    for name in p.samplers:
        if name in _KEEPS_TOP or name == "temperature":
            continue
        if name == "penalties" and (p.repeat_last_n == 0 or (
                p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0)):
            continue
        if (name == "dry" and p.dry_multiplier == 0.0) or (name == "typ_p" and p.typical_p >= 1.0):
            continue
        if name == "xtc" and (p.xtc_probability <= 0.0 or p.xtc_threshold > 0.5):
            continue
        if name == "adaptive_p":
            continue
        return False  # infill, or a sampler configured to reshape or drop the top
    return True


_rows: dict[int, np.ndarray] = {}  # address of a row of logits -> a numpy view of it


def logits_row(ctx: _internals.LlamaContext, row: int, n_vocab: int) -> np.ndarray:
    """A row of the context's logits as a numpy view (no copy). The output buffer keeps its rows
    at the same addresses step after step, so a view is made once per address (as_array on a
    262k-float pointer costs about 0.04 ms a token in the decode loop)."""
    address = ctypes.cast(llama_cpp.llama_get_logits_ith(ctx.ctx, row), ctypes.c_void_p).value
    if address is None:
        raise RuntimeError(f"llama.cpp has no logits for batch row {row}")
    view = _rows.get(address)
    if view is None or view.shape[0] != n_vocab:
        if len(_rows) > 256:  # a context was freed and another made: drop the stale views
            _rows.clear()
        view = _rows[address] = np.ctypeslib.as_array(
            ctypes.cast(address, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))
    return view


def argmax_biased(logits: np.ndarray, bias_ids: np.ndarray, bias_values: np.ndarray) -> int:
    """The token with the highest logit after adding `bias_values` to the logits of `bias_ids`
    (lowest id on a tie), without copying the vocabulary when the top token carries no bias."""
    best = int(logits.argmax())
    if not bias_ids.size:
        return best
    if best in bias_ids:
        biased = logits.copy()
        biased[bias_ids] += bias_values
        return int(biased.argmax())
    shifted = logits[bias_ids] + bias_values
    top = float(logits[best])
    for token, value in zip(bias_ids.tolist(), shifted.tolist(), strict=True):
        if value > top or (value == top and token < best):
            best, top = token, value
    return best


def _log(p: float) -> float:
    return math.log(p) if p > 0 else -3.4028234663852886e38  # llama-server's lowest float, never -inf


def token_logprob(model: LoadedModel, ctx: _internals.LlamaContext, row: int, token: int,
                  n_probs: int) -> TokenLogprob:
    """Pre-sampling log-probabilities (plain softmax of the logits), as llama-server reports them."""
    n_vocab = model.n_vocab
    logits = logits_row(ctx, row, n_vocab).astype(np.float64)
    shifted = logits - logits.max()
    logprobs = shifted - np.log(np.exp(shifted).sum())
    top = np.argpartition(-logprobs, min(n_probs, n_vocab - 1))[:n_probs]
    top = top[np.argsort(-logprobs[top])]
    chosen = _token_prob(model, token, float(logprobs[token]))
    return TokenLogprob(id=chosen.id, token=chosen.token, bytes=chosen.bytes, logprob=chosen.logprob,
                        top_logprobs=[_token_prob(model, int(t), float(logprobs[t])) for t in top])


def _token_prob(model: LoadedModel, token: int, logprob: float) -> TokenProb:
    piece = model.token_piece(token)
    return TokenProb(id=token, token=piece.decode("utf-8", "ignore"), bytes=list(piece), logprob=logprob)
