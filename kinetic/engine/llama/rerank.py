"""Reranking (--rerank): a query and each document scored by the model's classification head.

The embedding context runs with pooling rank, where llama.cpp applies the head (BERT-style: the first
token's state through `cls` and `cls.output`; Qwen3-style: the last token's) and the pooled output's first
value is the score. Each pair is laid out as llama-server's format_prompt_rerank lays it out: the model's
`rerank` template with {query} and {document} filled in when it has one, else [BOS] query [EOS] [SEP]
document [EOS], each special token only where the vocabulary adds it.
"""

from __future__ import annotations

import llama_cpp

from kinetic.engine.llama.embeddings import EmbeddingContext
from kinetic.engine.llama.model import LoadedModel
from kinetic.engine.types import RankScore
from kinetic.errors import InvalidRequestError

NULL_TOKEN = -1  # LLAMA_TOKEN_NULL


def rerank_template(model: LoadedModel) -> str | None:
    """The GGUF's `tokenizer.chat_template.rerank` (Qwen3 rerankers have one), or None."""
    raw = llama_cpp.llama_model_chat_template(model.model.model, b"rerank")
    return raw.decode("utf-8") if raw else None


def pair_tokens(model: LoadedModel, template: str | None, query: str, document: str) -> list[int]:
    """One (query, document) pair as the model reads it: laid out by `template` (rerank_template) or, with
    none, by the vocabulary's special tokens."""
    if template is not None:
        prompt = template.replace("{query}", query).replace("{document}", document)
        return model.tokenize(prompt, add_special=False, parse_special=True)
    vocab = model.vocab
    eos = llama_cpp.llama_vocab_eos(vocab)
    if eos == NULL_TOKEN:
        eos = llama_cpp.llama_vocab_sep(vocab)
    add_eos = llama_cpp.llama_vocab_get_add_eos(vocab)
    tokens = [llama_cpp.llama_vocab_bos(vocab)] if llama_cpp.llama_vocab_get_add_bos(vocab) else []
    tokens += model.tokenize(query, add_special=False, parse_special=False)
    tokens += [eos] if add_eos else []
    tokens += [llama_cpp.llama_vocab_sep(vocab)] if llama_cpp.llama_vocab_get_add_sep(vocab) else []
    tokens += model.tokenize(document, add_special=False, parse_special=False)
    tokens += [eos] if add_eos else []
    return tokens


def rerank_inputs(context: EmbeddingContext, query: str, documents: list[str]) -> list[list[int]]:
    """Each (query, document) pair's tokens, every one checked against the context before any is scored."""
    template = rerank_template(context.model)
    inputs = [pair_tokens(context.model, template, query, document) for document in documents]
    for tokens in inputs:
        if len(tokens) > context.n_ctx:
            raise InvalidRequestError(f"input ({len(tokens)} tokens) is larger than the max context size "
                                      f"({context.n_ctx} tokens). skipping", param="documents")
    return inputs


def score(context: EmbeddingContext, tokens: list[int]) -> RankScore:
    """One pair's score. Blocking, on the compute thread (one pair a call: streams take steps between them)."""
    with context.decode_lock:
        context.decode(tokens)
        pooled = llama_cpp.llama_get_embeddings_seq(context.ctx.ctx, 0)
        return RankScore(score=float(pooled[0]), n_tokens=len(tokens))
