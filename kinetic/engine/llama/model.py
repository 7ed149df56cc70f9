"""A GGUF loaded by llama.cpp, and its tokenizer.

The model's weights and vocabulary are read-only once loaded, so tokenizing is safe from any
thread while the decode thread runs.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import _internals
from llama_cpp import _logger as llama_logger

from kinetic.engine.llama import offload
from kinetic.engine.llama.control_vector import apply_control_vector, load_control_vectors
from kinetic.engine.llama.params import init_numa, model_params
from kinetic.engine.llama.threads import attach_threadpools
from kinetic.engine.options import LlamaOptions
from kinetic.engine.types import MemoryKind, ModelInfo
from kinetic.errors import ModelLoadError

log = logging.getLogger(__name__)

# The tokens of the last texts tokenized, up to this many characters each. A class sends the same texts again and
# again (a lab's prompt, a retry, a benchmark's prompt, the template's system turn), and llama_tokenize is dear
# for what it does: on a vocabulary with thousands of special tokens (Gemma's 6414) it looks for each of them in
# the text, and the decode steps between two requests leave its tables out of the CPU's caches. A short prompt on
# the tiny LFM2 took 0.2-0.5 ms on the event loop, one request after another; a hit takes microseconds.
CACHED_TEXTS = 128
CACHED_TEXT_CHARS = 8192


@dataclass
class LoraAdapter:
    """A LoRA adapter loaded for the model (--lora), and the scale every context applies it at."""

    path: Path
    handle: Any  # llama_adapter_lora pointer, freed with the model
    scale: float


class LoadedModel:
    """llama.cpp's model and vocabulary handles plus the tokenizer calls kinetic makes."""

    def __init__(self, path: Path, *, verbose: bool = False,
                 options: LlamaOptions = LlamaOptions()):  # noqa: B008  frozen dataclass: a shared default is safe
        llama_logger.set_verbose(verbose)
        llama_cpp.llama_backend_init()
        init_numa(options)
        self.path = path
        self.verbose = verbose
        self.options = options
        self.special = options.special  # --special: generated special tokens show as their text (<end_of_turn>...)
        built = model_params(options)
        try:
            self.model = _internals.LlamaModel(path_model=str(path), params=built.params, verbose=verbose)
        except ValueError as exc:
            raise ModelLoadError(f"cannot load model {path}: llama.cpp rejected the file "
                                 "(truncated, corrupt, or an architecture this build does not know)") from exc
        self.lora = [self._load_lora(Path(adapter), 0.0 if options.lora_init_without_apply else scale)
                     for adapter, scale in options.lora]
        self.control_vector = load_control_vectors(options.control_vectors) if options.control_vectors else None
        placed = offload.placement(options, llama_cpp.llama_model_n_layer(self.model.model))
        for line in offload.log_lines(placed):
            log.info("%s: %s", path.name, line)
        self.vocab = self.model.vocab
        self.n_vocab = self.model.n_vocab()
        self._pieces: dict[int, bytes] = {}  # token -> its text, as the decode loop asks for every token
        self._tokens: collections.OrderedDict[tuple[str, bool, bool], tuple[int, ...]] = collections.OrderedDict()
        self._tokens_lock = threading.Lock()
        metadata = self.model.metadata()
        bos, eos = self.model.token_bos(), self.model.token_eos()
        self.info = ModelInfo(
            path=path,
            architecture=metadata.get("general.architecture", ""),
            description=self.model.desc(),
            n_vocab=self.n_vocab,
            n_ctx_train=self.model.n_ctx_train(),
            n_embd=self.model.n_embd(),
            n_params=self.model.n_params(),
            size=self.model.size(),
            vocab_type=self.model.vocab_type(),
            bos_token=self.token_piece(bos, special=True).decode("utf-8", "replace") if bos >= 0 else "",
            eos_token=self.token_piece(eos, special=True).decode("utf-8", "replace") if eos >= 0 else "",
            bos_id=bos,
            add_bos=self.model.add_bos_token(),
            chat_template=metadata.get("tokenizer.chat_template"),
            metadata=metadata,
            fim_tokens={name: int(getattr(llama_cpp, f"llama_vocab_fim_{name}")(self.vocab))
                        for name in ("pre", "suf", "mid", "rep", "sep", "pad")},
            memory_kind=self._memory_kind(),
            offload=placed,
            eog_ids=self.eog_tokens,
        )

    def _memory_kind(self) -> MemoryKind:
        if llama_cpp.llama_model_is_hybrid(self.model.model):
            return "hybrid"
        if llama_cpp.llama_model_is_recurrent(self.model.model):
            return "recurrent"
        return "attention"

    def _load_lora(self, path: Path, scale: float) -> LoraAdapter:
        handle = llama_cpp.llama_adapter_lora_init(self.model.model, str(path).encode("utf-8"))
        if not handle:
            raise ModelLoadError(f"cannot load LoRA adapter {path}: llama.cpp rejected it (not a LoRA GGUF, or made "
                                 f"for another base model than {self.path.name})")
        return LoraAdapter(path=path, handle=handle, scale=scale)

    def new_context(self, params: Any) -> _internals.LlamaContext:
        """A context with the server's LoRA adapters applied at their scales, its control vector, and thread pools
        made with the CPU flags when any is given."""
        ctx = _internals.LlamaContext(model=self.model, params=params, verbose=self.verbose)
        attach_threadpools(ctx, self.options.cpu, self.options.cpu_batch, params.n_threads, params.n_threads_batch)
        self.apply_lora(ctx)
        if self.control_vector is not None:
            apply_control_vector(ctx.ctx, self.control_vector, self.options.control_vector_layers,
                                 llama_cpp.llama_model_n_layer(self.model.model))
        return ctx

    def warm_up(self, ctx: _internals.LlamaContext, n_batch: int) -> None:
        """llama-server's warm-up (--warmup, on by default): one decode of BOS and EOS, then the memory cleared.
        The backends' first-use costs (kernels loaded, a GPU's BLAS handles and buffers, the compute graph's
        allocation) are paid here at load instead of in the first request's TTFT."""
        tokens = [t for t in (self.model.token_bos(), self.model.token_eos()) if t != llama_cpp.LLAMA_TOKEN_NULL]
        tokens = (tokens or [0])[:max(1, n_batch)]
        array = (llama_cpp.llama_token * len(tokens))(*tokens)
        llama_cpp.llama_decode(ctx.ctx, llama_cpp.llama_batch_get_one(array, len(tokens)))
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx.ctx), True)
        llama_cpp.llama_synchronize(ctx.ctx)
        llama_cpp.llama_perf_context_reset(ctx.ctx)

    def lora_scales(self, request: tuple[tuple[int, float], ...] | None = None) -> tuple[float, ...]:
        """Every adapter's scale, in id order: the server's, or a request's own (llama-server's
        construct_lora_list: an adapter the request leaves out gets 0, an unknown id is ignored)."""
        if request is None:
            return tuple(adapter.scale for adapter in self.lora)
        asked = dict(request)
        return tuple(asked.get(index, 0.0) for index in range(len(self.lora)))

    def apply_lora(self, ctx: _internals.LlamaContext, scales: tuple[float, ...] | None = None) -> None:
        """Sets adapter scales on a context (default: the server's; a scale of 0 leaves the adapter out)."""
        if not self.lora:
            return
        chosen = self.lora_scales() if scales is None else scales
        active = [(adapter, scale) for adapter, scale in zip(self.lora, chosen, strict=True) if scale != 0.0]
        handles = (llama_cpp.llama_adapter_lora_p_ctypes * len(active))(*[a.handle for a, _ in active])
        scales_c = (ctypes.c_float * len(active))(*[scale for _, scale in active])
        if llama_cpp.llama_set_adapters_lora(ctx.ctx, handles, len(active), scales_c) != 0:
            raise RuntimeError("llama.cpp refused the LoRA adapters for a context")

    def pooling_type(self) -> int:
        """The pooling the GGUF declares for embeddings, or -1 when it declares none."""
        value = self.info.metadata.get(f"{self.info.architecture}.pooling_type")
        return int(value) if value is not None else -1

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        if len(text) > CACHED_TEXT_CHARS:
            return self._tokenize(text, add_special, parse_special)
        key = (text, add_special, parse_special)
        with self._tokens_lock:  # the event loop and worker threads both tokenize
            tokens = self._tokens.get(key)
            if tokens is not None:
                self._tokens.move_to_end(key)
                return list(tokens)
        tokens = tuple(self._tokenize(text, add_special, parse_special))
        with self._tokens_lock:
            self._tokens[key] = tokens
            if len(self._tokens) > CACHED_TEXTS:
                self._tokens.popitem(last=False)
        return list(tokens)

    def _tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buffer = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buffer, capacity, add_special, parse_special)
        if n < 0:
            buffer = (llama_cpp.llama_token * -n)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buffer, -n, add_special, parse_special)
        return list(buffer[:n])

    def token_piece(self, token: int, *, special: bool = False) -> bytes:
        """A token's text; special tokens render as text when asked, or always with --special."""
        if not special:
            piece = self._pieces.get(token)
            if piece is None:
                piece = self._pieces[token] = self._piece(token, special=self.special)
            return piece
        return self._piece(token, special=True)

    def _piece(self, token: int, *, special: bool) -> bytes:
        buffer = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buffer, 64, 0, special)
        if n < 0:
            buffer = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buffer, -n, 0, special)
        return buffer.raw[:n]

    def detokenize(self, tokens: list[int], *, special: bool = False) -> str:
        # negative ids stand for media (media.py): they have no text
        return b"".join(self.token_piece(t, special=special) for t in tokens if t >= 0).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return token in self._eog_set

    @functools.cached_property
    def _eog_set(self) -> frozenset[int]:
        return frozenset(self.eog_tokens)

    @functools.cached_property
    def token_ids(self) -> np.ndarray:
        """0 .. n_vocab-1, the ids column of a candidate array (filled once, copied per step)."""
        return np.arange(self.n_vocab, dtype=np.int32)

    @functools.cached_property
    def eog_tokens(self) -> tuple[int, ...]:
        """Every end-of-generation token (EOS, EOT, <end_of_turn>...): scanned once, the vocabulary is large."""
        return tuple(t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self.vocab, t))

    def valid_token(self, token: int) -> bool:
        return 0 <= token < self.n_vocab
