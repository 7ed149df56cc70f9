"""A control vector GGUF for the bundled Gemma 3 270M, written at test time with the `gguf` package in
llama.cpp's layout (what its cvector-generator writes): one F32 `direction.<layer>` of n_embd values for each
layer from 1, random and large enough to change greedy output."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

N_LAYERS = 18  # Gemma 3 270M
EMBD = 640


def write_control_vector(path: Path, *, seed: int = 0, strength: float = 4.0, layers: int = N_LAYERS - 1,
                         n_embd: int = EMBD) -> Path:
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch="controlvector")
    writer.add_string("controlvector.model_hint", "gemma3")
    writer.add_uint32("controlvector.layer_count", layers)
    for layer in range(1, layers + 1):
        writer.add_tensor(f"direction.{layer}", (rng.standard_normal(n_embd) * strength).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
