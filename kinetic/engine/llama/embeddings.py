"""Embeddings from the served model, in a llama.cpp context of their own (one input at a time):
pooled as the model declares (or mean), or as `--pooling` says; `none` gives one vector per token."""

from __future__ import annotations

import time

import llama_cpp
import numpy as np
from llama_cpp import _internals

from kinetic.engine.llama.batch import add_token
from kinetic.engine.llama.model import LoadedModel
from kinetic.engine.turns import DecodeLock
from kinetic.errors import InvalidRequestError, ServerError

MAX_EMBEDDING_CTX = 2048
POOLING_TYPES = {"none": llama_cpp.LLAMA_POOLING_TYPE_NONE, "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
                 "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS, "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
                 "rank": llama_cpp.LLAMA_POOLING_TYPE_RANK}


class EmbeddingContext:
    """A second context with pooling on. `decode_lock` is the generation context's: the two never
    decode at the same time (llama.cpp's threads spin; two decodes at once crawl)."""

    def __init__(self, model: LoadedModel, *, n_ctx: int, n_threads: int, decode_lock: DecodeLock,
                 pooling: str | None = None):
        self.model = model
        self.decode_lock = decode_lock
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = min(n_ctx, MAX_EMBEDDING_CTX)
        params.n_batch = params.n_ctx
        params.n_ubatch = params.n_ctx  # one input must fit in one micro-batch for pooling
        params.n_seq_max = 1
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.embeddings = True
        declared = model.pooling_type()
        if pooling is not None:
            params.pooling_type = POOLING_TYPES[pooling]
        else:
            params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_MEAN if declared <= 0 else declared
        self.pooling = next(name for name, value in POOLING_TYPES.items() if value == params.pooling_type)
        self.ctx = model.new_context(params)
        self.batch = _internals.LlamaBatch(n_tokens=params.n_ctx, embd=0, n_seq_max=1, verbose=model.verbose)
        self.n_ctx = params.n_ctx
        # counted into /metrics as llama-server counts embeddings: prompt tokens and decodes, nothing predicted
        # (llama-server runs an embedding in a slot: one busy slot for that decode)
        self.counters = {"prompt_tokens_total": 0.0, "prompt_seconds_total": 0.0, "n_decode_total": 0.0,
                         "n_busy_slots_total": 0.0}

    def embed(self, tokens: list[int]) -> list[float]:
        """One input's pooled, L2-normalised vector (mean pooling unless the model names its own). Blocking, on
        the compute thread: LlamaEngine hands over one input at a time, so that streams take steps between them."""
        if self.pooling == "none":
            raise InvalidRequestError("--pooling none gives one vector per token: only the native /embedding "
                                      "answers it", param="input")
        [vector] = self.embed_raw(tokens)
        array = np.asarray(vector)
        norm = float(np.linalg.norm(array))
        return (array / norm if norm > 0 else array).tolist()

    def decode(self, tokens: list[int]) -> None:
        """Evaluates one input from an empty cache, its outputs then readable; the caller holds decode_lock."""
        if self.ctx.memory is not None:  # encoder-only models keep no cache
            llama_cpp.llama_memory_clear(self.ctx.memory, True)
        self.batch.batch.n_tokens = 0
        for pos, token in enumerate(tokens):
            add_token(self.batch, token, pos, 0, True)
        start = time.perf_counter()
        if llama_cpp.llama_decode(self.ctx.ctx, self.batch.batch) != 0:
            raise ServerError("llama_decode failed while computing an embedding")
        self.counters["prompt_tokens_total"] += len(tokens)
        self.counters["prompt_seconds_total"] += time.perf_counter() - start
        self.counters["n_decode_total"] += 1
        self.counters["n_busy_slots_total"] += 1

    def embed_raw(self, tokens: list[int]) -> list[list[float]]:
        """One input's raw (unnormalised) vectors: one pooled vector, or one per token with pooling none."""
        if self.pooling == "rank":  # one score per input, not a vector: /rerank reads it (rerank.py)
            raise InvalidRequestError("this server ranks documents (--rerank, --pooling rank): use /rerank",
                                      param="input")
        n_embd = self.model.info.n_embd
        with self.decode_lock:
            self.decode(tokens)
            if self.pooling == "none":
                rows = [llama_cpp.llama_get_embeddings_ith(self.ctx.ctx, i) for i in range(len(tokens))]
            else:
                rows = [llama_cpp.llama_get_embeddings_seq(self.ctx.ctx, 0)]
            return [np.ctypeslib.as_array(row, shape=(n_embd,)).astype(np.float64).tolist() for row in rows]
