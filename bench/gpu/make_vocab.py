"""Writes a GGUF that holds the bundled Gemma's tokenizer and nothing else (no tensors): about 4 MB where
the model is 250 MB, so the GPU bundle can carry it, and bench/bench_model.py --tokenizer writes the bench
model from it exactly as from the bundled Gemma (both copy the same tokenizer.* keys: tests/hybrid_model.py).

    python bench/gpu/make_vocab.py TARGET.gguf [SOURCE.gguf]   # SOURCE: the bundled Gemma by default
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.hybrid_model import copy_tokenizer, tokenizer_fields, write_gguf  # noqa: E402


def write_vocabulary(source: Path, target: Path) -> Path:
    """`target`: every tokenizer.* key that copy_tokenizer takes from `source`, under `source`'s architecture."""
    import gguf

    architecture = str(gguf.GGUFReader(str(source)).fields["general.architecture"].contents())

    def fill(writer: Any) -> None:
        copy_tokenizer(writer, source)

    return write_gguf(target, architecture, "kinetic bench tokenizer (the bundled Gemma's, no tensors)", fill)


def main() -> None:
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    target = Path(sys.argv[1])
    if len(sys.argv) == 3:
        source = Path(sys.argv[2])
    else:
        from kinetic.backends.bundled import gemma_model_path

        source = gemma_model_path()
    write_vocabulary(source, target)
    print(f"{target}: {len(tokenizer_fields(source))} tokenizer keys of {source}")


if __name__ == "__main__":
    main()
