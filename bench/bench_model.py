"""Benchmark-sized hybrid models: the course's layer patterns at the cost of its models, random weights.

The tests' hybrid models (tests/hybrid_model.py) are 64 wide: a token costs nothing, so a benchmark on
them measures per-request overhead and the load generator, not what sharing a prompt saves. These are
as wide and deep as the course's models, written once with the `gguf` package (Q8_0 weights drawn at
random, the bundled Gemma's tokenizer) and cached under ~/.cache/kinetic/bench-models/. The suite never
builds them: only the bench scripts do (`bench_streams.py --model bench:qwen35`).

- `qwen35`: Qwen3.5-0.8B's shape. 24 layers of width 1024, three gated delta nets then one gated full
  attention (18 + 6); delta nets of 16 key and 16 value heads with a 128 x 128 state and a 4-wide
  convolution; attention of 8 query heads of 256 over 2 KV heads, a quarter of each head turned
  (M-RoPE sections 11/11/10); FFN 3584. Matrix weights 0.50 B outside the embedding, 0.27 B in it
  (Gemma's 262144-token vocabulary against Qwen's 248320, tied as in the real model).
  FLOPs a token (2 x multiply-adds of the matrices): about 1.00 G for a prompt token (the output layer
  runs on the last one only) and 1.54 G for a generated one; the real 0.8B's are 1.00 G and 1.51 G.
- `lfm2`: LFM2's layout (short convolutions, grouped-query attention at LFM2-350M's six places of 16
  layers), width 1024, FFN 8192 so that a token costs what the Qwen3.5 one does (0.46 B outside the
  embedding: 0.93 G FLOPs a prompt token).

Measured on the 2-core machine with llama-server (`--no-repack`, 2 threads, `python bench/bench_model.py
qwen35 --measure`): see docs/instructors/index.md. Writing one takes about half a minute (the weights
are random bytes laid out as Q8_0 blocks, not floats quantized one by one) and about 1 GiB of memory.

    python bench/bench_model.py qwen35 [--measure]   # writes it if missing, prints its path and sizes
    python bench/bench_model.py qwen35 --tokenizer .gpu-bundle/gemma-vocab.gguf   # without the bundled model
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.hybrid_model import copy_tokenizer, vocabulary_size, write_gguf  # noqa: E402

FORMAT_VERSION = 1  # bump when the weights or the layout change: the cached files are rebuilt
SEED = 33
N_EMBD = 1024
N_CTX_TRAIN = 32768
Q8_BLOCK = 32  # values a Q8_0 block holds (one f16 scale, then 32 int8)
INT8_UNIFORM_STD = 73.9  # standard deviation of an int8 drawn uniformly from its 256 values


def cache_dir() -> Path:
    return Path(os.environ.get("KINETIC_BENCH_MODELS", Path.home() / ".cache" / "kinetic" / "bench-models"))


class Weights:
    """Adds random tensors to a GGUF writer."""

    def __init__(self, writer: Any, rng: np.random.Generator):
        self.writer = writer
        self.rng = rng

    def matrix(self, name: str, n_out: int, n_in: int, std: float | None = None) -> None:
        """A (n_out, n_in) Q8_0 matrix of uniform random int8 under one scale: the spread an init of
        std 1/sqrt(n_in) gives, at the cost of drawing bytes rather than floats."""
        import gguf

        self.writer.add_tensor(name, self._q8(n_out, n_in, std or 1.0 / np.sqrt(n_in)),
                               raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def embedding(self, n_vocab: int) -> None:
        import gguf

        self.writer.add_tensor("token_embd.weight", self._q8(n_vocab, N_EMBD, 0.1),
                               raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def vector(self, name: str, value: float, *shape: int) -> None:
        self.writer.add_tensor(name, np.full(shape, value, dtype=np.float32))

    def small(self, name: str, *shape: int, scale: float) -> None:
        """A small f32 tensor (convolution kernels, per-head projections): numpy shape (out, in)."""
        # float32 throughout: a numpy float64 scale would promote the tensor to F64, which ggml cannot multiply
        self.writer.add_tensor(name, (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)))

    def _q8(self, n_out: int, n_in: int, std: float) -> np.ndarray:
        blocks = n_out * n_in // Q8_BLOCK
        raw = np.frombuffer(self.rng.bytes(blocks * (Q8_BLOCK + 2)), dtype=np.uint8).reshape(blocks, Q8_BLOCK + 2)
        raw = raw.copy()
        raw[:, :2] = np.frombuffer(np.float16(std / INT8_UNIFORM_STD).tobytes(), dtype=np.uint8)
        return raw.reshape(n_out, (n_in // Q8_BLOCK) * (Q8_BLOCK + 2))


def _write_qwen35(writer: Any, w: Weights, n_vocab: int) -> None:
    n_layer, n_head, n_kv, head_dim, n_ff = 24, 8, 2, 256, 3584
    d_conv, head_state, k_heads, v_heads = 4, 128, 16, 16
    key_dim, value_dim = head_state * k_heads, head_state * v_heads
    conv_dim = 2 * key_dim + value_dim
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(n_ff)
    writer.add_block_count(n_layer)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim // 4)
    writer.add_rope_dimension_sections([11, 11, 10, 0])
    writer.add_rope_freq_base(10_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_ssm_conv_kernel(d_conv)
    writer.add_ssm_inner_size(value_dim)
    writer.add_ssm_state_size(head_state)
    writer.add_ssm_time_step_rank(v_heads)
    writer.add_ssm_group_count(k_heads)
    writer.add_full_attention_interval(4)
    writer.add_vocab_size(n_vocab)
    w.embedding(n_vocab)
    w.vector("output_norm.weight", 1.0, N_EMBD)
    for i in range(n_layer):
        block = f"blk.{i}"
        w.vector(f"{block}.attn_norm.weight", 1.0, N_EMBD)
        w.vector(f"{block}.post_attention_norm.weight", 1.0, N_EMBD)
        w.matrix(f"{block}.ffn_gate.weight", n_ff, N_EMBD)
        w.matrix(f"{block}.ffn_up.weight", n_ff, N_EMBD)
        w.matrix(f"{block}.ffn_down.weight", N_EMBD, n_ff)
        if (i + 1) % 4 == 0:  # gated full attention: the query doubled by the output gate
            w.matrix(f"{block}.attn_q.weight", 2 * n_head * head_dim, N_EMBD)
            w.matrix(f"{block}.attn_k.weight", n_kv * head_dim, N_EMBD)
            w.matrix(f"{block}.attn_v.weight", n_kv * head_dim, N_EMBD)
            w.matrix(f"{block}.attn_output.weight", N_EMBD, n_head * head_dim)
            w.vector(f"{block}.attn_q_norm.weight", 1.0, head_dim)
            w.vector(f"{block}.attn_k_norm.weight", 1.0, head_dim)
        else:
            w.matrix(f"{block}.attn_qkv.weight", conv_dim, N_EMBD)
            w.matrix(f"{block}.attn_gate.weight", value_dim, N_EMBD)
            w.small(f"{block}.ssm_conv1d.weight", conv_dim, d_conv, scale=0.5)
            w.vector(f"{block}.ssm_dt.bias", 0.0, v_heads)
            w.vector(f"{block}.ssm_a", -1.0, v_heads)
            w.small(f"{block}.ssm_beta.weight", v_heads, N_EMBD, scale=1.0 / np.sqrt(N_EMBD))
            w.small(f"{block}.ssm_alpha.weight", v_heads, N_EMBD, scale=1.0 / np.sqrt(N_EMBD))
            w.vector(f"{block}.ssm_norm.weight", 1.0, head_state)
            w.matrix(f"{block}.ssm_out.weight", N_EMBD, value_dim)


# LFM2-350M's layers: attention at these indices of 16, short convolutions elsewhere
LFM2_ATTENTION = {2, 5, 8, 10, 12, 14}


def _write_lfm2(writer: Any, w: Weights, n_vocab: int) -> None:
    n_layer, n_head, n_kv, head_dim, n_ff, l_cache = 16, 16, 8, 64, 8192, 3
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(n_ff)
    writer.add_block_count(n_layer)
    writer.add_head_count(n_head)
    writer.add_head_count_kv([n_kv if i in LFM2_ATTENTION else 0 for i in range(n_layer)])
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_shortconv_l_cache(l_cache)
    writer.add_vocab_size(n_vocab)
    w.embedding(n_vocab)
    w.vector("token_embd_norm.weight", 1.0, N_EMBD)  # LFM2's final norm, under this name in llama.cpp
    for i in range(n_layer):
        block = f"blk.{i}"
        w.vector(f"{block}.attn_norm.weight", 1.0, N_EMBD)
        w.vector(f"{block}.ffn_norm.weight", 1.0, N_EMBD)
        w.matrix(f"{block}.ffn_gate.weight", n_ff, N_EMBD)
        w.matrix(f"{block}.ffn_up.weight", n_ff, N_EMBD)
        w.matrix(f"{block}.ffn_down.weight", N_EMBD, n_ff)
        if i in LFM2_ATTENTION:
            w.vector(f"{block}.attn_q_norm.weight", 1.0, head_dim)
            w.vector(f"{block}.attn_k_norm.weight", 1.0, head_dim)
            w.matrix(f"{block}.attn_q.weight", n_head * head_dim, N_EMBD)
            w.matrix(f"{block}.attn_k.weight", n_kv * head_dim, N_EMBD)
            w.matrix(f"{block}.attn_v.weight", n_kv * head_dim, N_EMBD)
            w.matrix(f"{block}.attn_output.weight", N_EMBD, n_head * head_dim)
        else:
            w.small(f"{block}.shortconv.conv.weight", N_EMBD, l_cache, scale=0.5)
            w.matrix(f"{block}.shortconv.in_proj.weight", 3 * N_EMBD, N_EMBD)
            w.matrix(f"{block}.shortconv.out_proj.weight", N_EMBD, N_EMBD)


KINDS: dict[str, Callable[[Any, Weights, int], None]] = {"qwen35": _write_qwen35, "lfm2": _write_lfm2}


def write_model(kind: str, tokenizer_source: Path, target: Path) -> Path:
    import gguf

    def fill(writer: Any) -> None:
        copy_tokenizer(writer, tokenizer_source)
        KINDS[kind](writer, Weights(writer, np.random.default_rng(SEED)), vocabulary_size(tokenizer_source))

    return write_gguf(target, kind, f"kinetic-bench-{kind}", fill, gguf.LlamaFileType.MOSTLY_Q8_0)


def flops_per_token(model: Path) -> tuple[float, float]:
    """(prompt, generated) FLOPs a token: 2 x the multiply-adds of every matrix, the output layer (the tied
    embedding) counted for a generated token only, as llama.cpp computes logits for a prompt's last token."""
    import gguf

    reader = gguf.GGUFReader(str(model))
    layers = sum(int(t.n_elements) for t in reader.tensors
                 if len(t.shape) == 2 and t.name != "token_embd.weight" and "conv" not in t.name.split(".")[-2])
    output = next(int(t.n_elements) for t in reader.tensors if t.name == "token_embd.weight")
    return 2.0 * layers, 2.0 * (layers + output)


def bench_model(kind: str, tokenizer: Path | None = None) -> Path:
    """The cached bench model of `kind`, written on first use with the tokenizer of `tokenizer` (a GGUF whose
    tokenizer.* keys are the bundled Gemma's, e.g. bench/gpu/make_vocab.py's, where the bundled model's package
    is not installed) or else of the bundled Gemma."""
    if kind not in KINDS:
        raise SystemExit(f"unknown bench model {kind!r}: one of {', '.join(KINDS)}")
    target = cache_dir() / f"kinetic-bench-{kind}-v{FORMAT_VERSION}.gguf"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"writing the bench model {target} (once, about half a minute)", file=sys.stderr)
    if tokenizer is None:
        from kinetic.backends.bundled import gemma_model_path

        tokenizer = gemma_model_path()
    return write_model(kind, tokenizer, target)


def measure(model: Path, threads: int) -> None:
    """Prompt and decode speed of `model` on llama-server (its own timings), under the model lock."""
    import httpx
    from filelock import FileLock
    from load import MODEL_LOCK_PATH, llama_server

    server = llama_server(None, str(model), ["-t", str(threads), "--no-repack", "-c", "4096", "-np", "1"])
    if server is None:
        raise SystemExit("no llama-server binary (/tmp/lsbuild/bin/llama-server or PATH)")
    prompt = " ".join(f"word{i}" for i in range(300))
    with FileLock(str(MODEL_LOCK_PATH)), server:
        for _ in range(2):  # the first request warms the caches
            body = {"prompt": prompt, "n_predict": 32, "ignore_eos": True, "cache_prompt": False}
            timings = httpx.post(server.url + "/completion", json=body, timeout=600).json()["timings"]
        print(f"llama-server, {threads} threads: prompt {timings['prompt_n']} tokens at "
              f"{timings['prompt_per_second']:.1f} tok/s, decode {timings['predicted_per_second']:.1f} tok/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("--measure", action="store_true", help="time its prompt and decode on llama-server")
    parser.add_argument("-t", "--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--tokenizer", type=Path,
                        help="GGUF to take the tokenizer from when writing (default: the bundled Gemma)")
    args = parser.parse_args()
    path = bench_model(args.kind, args.tokenizer)
    prompt, generated = flops_per_token(path)
    print(f"{path} ({path.stat().st_size / 2**30:.2f} GiB): {prompt / 1e9:.2f} GFLOPs a prompt token, "
          f"{generated / 1e9:.2f} a generated one")
    if args.measure:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        measure(path, args.threads)


if __name__ == "__main__":
    main()
