"""The sampler chain a request's SamplingParams turn into, and the log-probabilities it reports."""

from __future__ import annotations

import numpy as np
import llama_cpp
from llama_cpp import _internals

from kinetic.engine.llama.model import LoadedModel
from kinetic.engine.types import SamplingParams, TokenLogprob, TokenProb
from kinetic.errors import InvalidRequestError


class Sampler:
    """One request's llama.cpp sampler chain; `sample` picks the next token from a row of logits."""

    def __init__(self, model: LoadedModel, params: SamplingParams):
        self.chain = _internals.LlamaSampler()
        try:
            self._build(model, params)
        except BaseException:
            self.chain.close()
            raise

    def _build(self, model: LoadedModel, params: SamplingParams) -> None:
        chain = self.chain
        n_vocab = model.n_vocab
        if params.grammar:
            grammar = llama_cpp.llama_sampler_init_grammar(model.vocab, params.grammar.encode("utf-8"), b"root")
            if not grammar:
                raise InvalidRequestError("Failed to initialize samplers: failed to parse grammar", param="grammar")
            llama_cpp.llama_sampler_chain_add(chain.sampler, grammar)
        bias = dict(params.logit_bias)
        if params.ignore_eos:
            bias.update({token: float("-inf") for token in model.eog_tokens})
        if bias:
            chain.add_logit_bias(n_vocab, bias)
        chain.add_penalties(n_vocab, params.repeat_last_n, params.repeat_penalty, params.frequency_penalty,
                            params.presence_penalty)
        if params.temperature <= 0:
            chain.add_greedy()
            return
        if params.top_k > 0:
            chain.add_top_k(params.top_k)
        if params.typical_p < 1.0:
            chain.add_typical(params.typical_p, 1)
        if params.top_p < 1.0:
            chain.add_top_p(params.top_p, 1)
        if params.min_p > 0.0:
            chain.add_min_p(params.min_p, 1)
        chain.add_temp(params.temperature)
        chain.add_dist(params.seed if params.seed >= 0 else llama_cpp.LLAMA_DEFAULT_SEED)

    def sample(self, ctx: _internals.LlamaContext, row: int) -> int:
        return int(llama_cpp.llama_sampler_sample(self.chain.sampler, ctx.ctx, row))

    def close(self) -> None:
        self.chain.close()


def token_logprob(model: LoadedModel, ctx: _internals.LlamaContext, row: int, token: int,
                  n_probs: int) -> TokenLogprob:
    """Pre-sampling log-probabilities (plain softmax of the logits), as llama-server reports them."""
    n_vocab = model.n_vocab
    pointer = llama_cpp.llama_get_logits_ith(ctx.ctx, row)
    logits = np.ctypeslib.as_array(pointer, shape=(n_vocab,)).astype(np.float64)
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
