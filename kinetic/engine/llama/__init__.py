"""The llama.cpp backend: the only package that imports llama_cpp.

Dependencies run one way: model (weights, tokenizer) <- sampler, embeddings <- scheduler (slots
and the decode thread) <- engine (assembles them behind kinetic.engine.base.Engine).
"""

from kinetic.engine.llama.engine import LlamaEngine

__all__ = ["LlamaEngine"]
