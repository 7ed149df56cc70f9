"""A LoRA adapter GGUF for the bundled Gemma 3 270M (or, given its shape, another model such as
tests/hybrid_model.py's LFM2), written at test time with the `gguf` package: random low-rank updates to
every layer's FFN down projection, large enough to change greedy output."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

RANK = 4
N_LAYERS = 18  # Gemma 3 270M
FFN, EMBD = 2048, 640  # blk.N.ffn_down.weight is [2048, 640] in ggml's order (in, out)


def write_lora(path: Path, *, seed: int = 0, strength: float = 0.5, arch: str = "gemma3", n_layers: int = N_LAYERS,
               ffn: int = FFN, embd: int = EMBD) -> Path:
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch=arch)  # llama.cpp loads an adapter only onto its architecture
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(RANK))
    for layer in range(n_layers):
        name = f"blk.{layer}.ffn_down.weight"
        # numpy's shape is ggml's ne reversed: lora_a ne [in, r], lora_b ne [r, out]
        writer.add_tensor(name + ".lora_a", (rng.standard_normal((RANK, ffn)) * strength).astype(np.float32))
        writer.add_tensor(name + ".lora_b", (rng.standard_normal((embd, RANK)) * strength).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
