"""--control-vector: llama.cpp's control vector GGUFs, summed and set on a context.

A control vector file holds one F32 tensor `direction.<layer>` of n_embd values per layer (layer 1 up; layer 0
is never steered). As common's common_control_vector_load does, every file's directions are multiplied by the
file's scale and summed into one buffer, n_embd values per layer from layer 1, which llama_set_adapter_cvec
adds to the output of each layer in the range.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from kinetic.errors import ModelLoadError

DIRECTION = "direction."


@dataclass(frozen=True)
class ControlVector:
    """The summed directions: row i steers layer i + 1."""

    data: np.ndarray  # float32, shape (layers, n_embd)

    @property
    def n_embd(self) -> int:
        return int(self.data.shape[1])


def _directions(path: Path) -> dict[int, np.ndarray]:
    """layer -> its direction, as the file holds them; ModelLoadError naming the file when it is not one."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load control vector {path}: not a GGUF file ({exc})") from exc
    directions: dict[int, np.ndarray] = {}
    for tensor in reader.tensors:
        layer_text = tensor.name.removeprefix(DIRECTION)
        if not tensor.name.startswith(DIRECTION) or not layer_text.isdigit() or int(layer_text) == 0:
            raise ModelLoadError(f"cannot load control vector {path}: tensor {tensor.name!r} is not "
                                 "direction.<layer> with a layer from 1")
        if tensor.tensor_type != gguf.GGMLQuantizationType.F32 or len(tensor.shape) != 1:
            raise ModelLoadError(f"cannot load control vector {path}: {tensor.name} is not a 1-D F32 tensor")
        layer = int(layer_text)
        # a file may hold a layer twice: its directions add up
        directions[layer] = directions.get(layer, 0) + np.asarray(tensor.data, dtype=np.float32)
    if not directions:
        raise ModelLoadError(f"cannot load control vector {path}: it has no direction tensors")
    if len({d.shape[0] for d in directions.values()}) != 1:
        raise ModelLoadError(f"cannot load control vector {path}: its directions differ in length")
    return directions


def load_control_vectors(files: Sequence[tuple[str, float]]) -> ControlVector:
    """Every (path, scale), scaled and summed layer by layer."""
    total: np.ndarray | None = None
    for name, scale in files:
        directions = _directions(Path(name).expanduser())
        n_embd = next(iter(directions.values())).shape[0]
        if total is not None and total.shape[1] != n_embd:
            raise ModelLoadError(f"cannot load control vector {name}: its directions have {n_embd} values, the "
                                 f"ones before {total.shape[1]}")
        layers = max(max(directions), total.shape[0] if total is not None else 0)
        grown = np.zeros((layers, n_embd), dtype=np.float32)
        if total is not None:
            grown[:total.shape[0]] = total
        for layer, direction in directions.items():
            grown[layer - 1] += direction * np.float32(scale)
        total = grown
    assert total is not None, "no control vector files"
    return ControlVector(total)


def apply_control_vector(ctx: llama_cpp.llama_context_p, vector: ControlVector, layers: tuple[int, ...],
                         n_layer: int) -> None:
    """Sets the vector on a context for layers START..END (llama-server's defaults: 1 and the last)."""
    start, end = layers
    start, end = start if start > 0 else 1, end if end > 0 else n_layer
    data = np.ascontiguousarray(vector.data, dtype=np.float32).ravel()
    pointer = data.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    if llama_cpp.llama_set_adapter_cvec(ctx, pointer, data.size, vector.n_embd, start, end) != 0:
        raise ModelLoadError(f"llama.cpp refused the control vector: its directions have {vector.n_embd} "
                             "values, which must be the model's embedding size")
