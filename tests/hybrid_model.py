"""Tiny random-weight GGUFs of the architectures whose memory is not one KV cell per token.

The course's own models are hybrid (Qwen3.5, LFM2: attention layers beside recurrent ones whose state is
one snapshot per sequence), so every cache path must be tried on such a memory. No such model can be
downloaded in the tests, and none ships in a package: these are written at test time with the `gguf`
package, with the bundled Gemma's tokenizer copied in (a real vocabulary, so prompts tokenize as on
Gemma). Their weights are random, so their text is nonsense, but it is the same on every load, which is
all the cache tests need: a cached prefix must give the very tokens a fresh evaluation gives.

- `lfm2`: LFM2 with 4 layers, short convolution / attention / short convolution / attention
  (`attention.head_count_kv` [0, 2, 0, 2]: a 0 makes that layer a convolution). llama.cpp gives it a
  hybrid memory (llama_model_is_hybrid).
- `qwen35`: Qwen3.5 with 4 layers, three gated delta nets then one gated full attention (hybrid), the
  layout of the lab's Qwen3.5-0.8B at a tiny width.
- `mamba`: Mamba with 2 layers, all recurrent (llama_model_is_recurrent).

The output layer shares the token embedding and the final norm is scaled so that the logits spread
wide: near-ties at the top would let the arithmetic of different batch shapes pick different greedy
tokens even with an exact cache, and the tests compare greedy texts.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

N_EMBD = 64
N_CTX_TRAIN = 4096
SEED = 20
FORMAT_VERSION = 1  # bump when the weights or the layout change: the cached files are rebuilt


def cache_dir() -> Path:
    return Path(os.environ.get("KINETIC_TEST_MODELS", Path.home() / ".cache" / "kinetic" / "test-models"))


@functools.lru_cache(maxsize=2)
def tokenizer_fields(source: Path) -> tuple[tuple[str, Any, Any, Any], ...]:
    """Every tokenizer.* key of `source` (the bundled Gemma) as (name, value, GGUF type, item type), read once a
    process: gguf's reader takes about 14 s over its 262k-token vocabulary, and each test model needs it."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    return tuple((field.name, field.contents(), field.types[0], field.types[-1]) for field in reader.fields.values()
                 if field.name.startswith("tokenizer.") and field.name != "tokenizer.chat_template")


def vocabulary_size(source: Path) -> int:
    return next(len(value) for name, value, _, _ in tokenizer_fields(source) if name == "tokenizer.ggml.tokens")


def copy_tokenizer(writer: Any, source: Path) -> None:
    """Every tokenizer.* key of `source`, with its GGUF type."""
    import gguf

    for name, value, vtype, item_type in tokenizer_fields(source):
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, value, vtype, sub_type=item_type)
        else:
            writer.add_key_value(name, value, vtype)


def _random(rng: np.random.Generator, *shape: int, scale: float | None = None) -> np.ndarray:
    """Weights for a matrix whose numpy shape is (out, in): scaled by its fan-in, as an init would."""
    std = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
    return (rng.standard_normal(shape) * std).astype(np.float32)


def _token_embedding(rng: np.random.Generator, n_vocab: int) -> np.ndarray:
    return (rng.standard_normal((n_vocab, N_EMBD)) * 0.1).astype(np.float16)


def _write_lfm2(writer: Any, rng: np.random.Generator, n_vocab: int) -> None:
    head_count, head_dim, n_ff, l_cache = 4, 16, 128, 3
    kv_heads = [0, 2, 0, 2]
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(n_ff)
    writer.add_block_count(len(kv_heads))
    writer.add_head_count(head_count)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_shortconv_l_cache(l_cache)
    writer.add_vocab_size(n_vocab)
    writer.add_tensor("token_embd.weight", _token_embedding(rng, n_vocab))
    # LFM2's final norm is stored under this name in llama.cpp; a large weight spreads the logits
    writer.add_tensor("token_embd_norm.weight", np.full(N_EMBD, 12.0, dtype=np.float32))
    for i, n_kv in enumerate(kv_heads):
        block = f"blk.{i}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", _random(rng, n_ff, N_EMBD))
        writer.add_tensor(f"{block}.ffn_up.weight", _random(rng, n_ff, N_EMBD))
        writer.add_tensor(f"{block}.ffn_down.weight", _random(rng, N_EMBD, n_ff))
        if n_kv == 0:
            writer.add_tensor(f"{block}.shortconv.conv.weight", _random(rng, N_EMBD, l_cache, scale=0.5))
            writer.add_tensor(f"{block}.shortconv.in_proj.weight", _random(rng, 3 * N_EMBD, N_EMBD))
            writer.add_tensor(f"{block}.shortconv.out_proj.weight", _random(rng, N_EMBD, N_EMBD))
        else:
            writer.add_tensor(f"{block}.attn_q_norm.weight", np.ones(head_dim, dtype=np.float32))
            writer.add_tensor(f"{block}.attn_k_norm.weight", np.ones(head_dim, dtype=np.float32))
            writer.add_tensor(f"{block}.attn_q.weight", _random(rng, head_count * head_dim, N_EMBD))
            writer.add_tensor(f"{block}.attn_k.weight", _random(rng, n_kv * head_dim, N_EMBD))
            writer.add_tensor(f"{block}.attn_v.weight", _random(rng, n_kv * head_dim, N_EMBD))
            writer.add_tensor(f"{block}.attn_output.weight", _random(rng, N_EMBD, head_count * head_dim))


def _write_qwen35(writer: Any, rng: np.random.Generator, n_vocab: int) -> None:
    """Qwen3.5's layout: three gated delta net layers, then one gated full-attention layer."""
    n_layer, head_count, kv_heads, head_dim, n_ff = 4, 4, 2, 32, 128
    d_conv, head_state, k_heads, v_heads = 4, 16, 2, 4  # gated delta net: 2 key heads, 4 value heads of 16
    key_dim, value_dim = head_state * k_heads, head_state * v_heads
    conv_dim = 2 * key_dim + value_dim
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(n_ff)
    writer.add_block_count(n_layer)
    writer.add_head_count(head_count)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(8)  # Qwen3.5 turns a quarter of each head
    writer.add_rope_dimension_sections([2, 1, 1, 0])
    writer.add_rope_freq_base(10_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_ssm_conv_kernel(d_conv)
    writer.add_ssm_inner_size(value_dim)
    writer.add_ssm_state_size(head_state)
    writer.add_ssm_time_step_rank(v_heads)
    writer.add_ssm_group_count(k_heads)
    writer.add_full_attention_interval(4)
    writer.add_vocab_size(n_vocab)
    writer.add_tensor("token_embd.weight", _token_embedding(rng, n_vocab))
    writer.add_tensor("output_norm.weight", np.full(N_EMBD, 12.0, dtype=np.float32))
    for i in range(n_layer):
        block = f"blk.{i}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"{block}.post_attention_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", _random(rng, n_ff, N_EMBD))
        writer.add_tensor(f"{block}.ffn_up.weight", _random(rng, n_ff, N_EMBD))
        writer.add_tensor(f"{block}.ffn_down.weight", _random(rng, N_EMBD, n_ff))
        if (i + 1) % 4 == 0:  # full attention, its query doubled by the output gate
            writer.add_tensor(f"{block}.attn_q.weight", _random(rng, 2 * head_count * head_dim, N_EMBD))
            writer.add_tensor(f"{block}.attn_k.weight", _random(rng, kv_heads * head_dim, N_EMBD))
            writer.add_tensor(f"{block}.attn_v.weight", _random(rng, kv_heads * head_dim, N_EMBD))
            writer.add_tensor(f"{block}.attn_output.weight", _random(rng, N_EMBD, head_count * head_dim))
            writer.add_tensor(f"{block}.attn_q_norm.weight", np.ones(head_dim, dtype=np.float32))
            writer.add_tensor(f"{block}.attn_k_norm.weight", np.ones(head_dim, dtype=np.float32))
        else:
            writer.add_tensor(f"{block}.attn_qkv.weight", _random(rng, conv_dim, N_EMBD))
            writer.add_tensor(f"{block}.attn_gate.weight", _random(rng, value_dim, N_EMBD))
            writer.add_tensor(f"{block}.ssm_conv1d.weight", _random(rng, conv_dim, d_conv, scale=0.5))
            writer.add_tensor(f"{block}.ssm_dt.bias", np.zeros(v_heads, dtype=np.float32))
            writer.add_tensor(f"{block}.ssm_a", -np.ones(v_heads, dtype=np.float32))
            writer.add_tensor(f"{block}.ssm_beta.weight", _random(rng, v_heads, N_EMBD))
            writer.add_tensor(f"{block}.ssm_alpha.weight", _random(rng, v_heads, N_EMBD))
            writer.add_tensor(f"{block}.ssm_norm.weight", np.ones(head_state, dtype=np.float32))
            writer.add_tensor(f"{block}.ssm_out.weight", _random(rng, N_EMBD, value_dim))


def _write_mamba(writer: Any, rng: np.random.Generator, n_vocab: int) -> None:
    n_layer, d_conv, d_state, dt_rank = 2, 4, 16, 4
    d_inner = 2 * N_EMBD  # llama.cpp supports an expansion factor of 2 only
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(0)
    writer.add_head_count(0)
    writer.add_block_count(n_layer)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_ssm_conv_kernel(d_conv)
    writer.add_ssm_inner_size(d_inner)
    writer.add_ssm_state_size(d_state)
    writer.add_ssm_time_step_rank(dt_rank)
    writer.add_vocab_size(n_vocab)
    writer.add_tensor("token_embd.weight", _token_embedding(rng, n_vocab))
    writer.add_tensor("output_norm.weight", np.full(N_EMBD, 12.0, dtype=np.float32))
    for i in range(n_layer):
        block = f"blk.{i}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"{block}.ssm_in.weight", _random(rng, 2 * d_inner, N_EMBD))
        writer.add_tensor(f"{block}.ssm_conv1d.weight", _random(rng, d_inner, d_conv, scale=0.5))
        writer.add_tensor(f"{block}.ssm_conv1d.bias", np.zeros(d_inner, dtype=np.float32))
        writer.add_tensor(f"{block}.ssm_x.weight", _random(rng, dt_rank + 2 * d_state, d_inner))
        writer.add_tensor(f"{block}.ssm_dt.weight", _random(rng, d_inner, dt_rank))
        writer.add_tensor(f"{block}.ssm_dt.bias", np.full(d_inner, -2.0, dtype=np.float32))
        # A = -exp(A_log) with Mamba's A_log = log(1..d_state), as the converter stores it
        a = -np.tile(np.arange(1, d_state + 1, dtype=np.float32), (d_inner, 1))
        writer.add_tensor(f"{block}.ssm_a", a)
        writer.add_tensor(f"{block}.ssm_d", np.ones(d_inner, dtype=np.float32))
        writer.add_tensor(f"{block}.ssm_out.weight", _random(rng, N_EMBD, d_inner))


ARCHITECTURES: dict[str, Callable[[Any, np.random.Generator, int], None]] = {
    "lfm2": _write_lfm2,
    "qwen35": _write_qwen35,
    "mamba": _write_mamba,
}


def write_gguf(target: Path, architecture: str, name: str, fill: Callable[[Any], None],
               file_type: int | None = None) -> Path:
    """A GGUF of `architecture` whose keys and tensors `fill` adds to the writer, written whole or not at all
    (`file_type` a gguf.LlamaFileType, F16 by default)."""
    import gguf

    partial = target.with_suffix(".partial")
    writer = gguf.GGUFWriter(str(partial), architecture)
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if file_type is None else file_type)
    fill(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(partial, target)
    return target


def write_model(architecture: str, tokenizer_source: Path, target: Path) -> Path:
    def fill(writer: Any) -> None:
        copy_tokenizer(writer, tokenizer_source)
        ARCHITECTURES[architecture](writer, np.random.default_rng(SEED), vocabulary_size(tokenizer_source))

    return write_gguf(target, architecture, f"kinetic-test-{architecture}", fill)


def tiny_model(architecture: str, vocabulary: str = "gemma") -> Path:
    """The cached tiny model of `architecture` (written on first use), with the vocabulary of the bundled Gemma
    (262k tokens, 6414 of them special) or of the bundled chat model, `smollm2` (49k, ChatML's markers special)."""
    from kinetic.backends.bundled import CHAT_MODEL, gemma_model_path

    name = f"kinetic-test-{architecture}" + ("" if vocabulary == "gemma" else f"-{vocabulary}")
    target = cache_dir() / f"{name}-v{FORMAT_VERSION}.gguf"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    source = {"gemma": gemma_model_path, "smollm2": CHAT_MODEL.path}[vocabulary]()
    return write_model(architecture, source, target)

