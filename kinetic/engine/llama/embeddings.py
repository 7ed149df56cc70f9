"""Embeddings from the served model, in a llama.cpp context of their own (pooled, one input at a time)."""

from __future__ import annotations

import numpy as np
import llama_cpp
from llama_cpp import _internals

from kinetic.engine.llama.model import LoadedModel
from kinetic.engine.turns import DecodeLock
from kinetic.errors import ServerError

MAX_EMBEDDING_CTX = 2048


class EmbeddingContext:
    """A second context with pooling on. `decode_lock` is the generation context's: the two never
    decode at the same time (llama.cpp's threads spin; two decodes at once crawl)."""

    def __init__(self, model: LoadedModel, *, n_ctx: int, n_threads: int, decode_lock: DecodeLock):
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
        pooling = model.pooling_type()
        params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_MEAN if pooling <= 0 else pooling
        self.ctx = model.new_context(params)
        self.batch = _internals.LlamaBatch(n_tokens=params.n_ctx, embd=0, n_seq_max=1, verbose=model.verbose)
        self.n_ctx = params.n_ctx

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """One pooled, L2-normalised vector per input (mean pooling unless the model names its own).
        Blocking; call it from a worker thread."""
        n_embd = self.model.info.n_embd
        vectors: list[list[float]] = []
        with self.decode_lock:
            for tokens in inputs:
                if self.ctx.memory is not None:  # encoder-only models keep no cache
                    llama_cpp.llama_memory_clear(self.ctx.memory, True)
                batch = self.batch.batch
                batch.n_tokens = 0
                for pos, token in enumerate(tokens):
                    batch.token[pos] = token
                    batch.pos[pos] = pos
                    batch.n_seq_id[pos] = 1
                    batch.seq_id[pos][0] = 0
                    batch.logits[pos] = True
                batch.n_tokens = len(tokens)
                if llama_cpp.llama_decode(self.ctx.ctx, batch) != 0:
                    raise ServerError("llama_decode failed while computing an embedding")
                pointer = llama_cpp.llama_get_embeddings_seq(self.ctx.ctx, 0)
                vector = np.ctypeslib.as_array(pointer, shape=(n_embd,)).astype(np.float64)
                norm = float(np.linalg.norm(vector))
                vectors.append((vector / norm if norm > 0 else vector).tolist())
        return vectors
