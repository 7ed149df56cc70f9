"""Reuse on hybrid and recurrent models (docs/models.md), in the parts that need no model: which saved
state may serve a prompt, and where the chat layer says a conversation's shared prefix ends."""

from __future__ import annotations

import random
from dataclasses import replace

from kinetic.chat.prepare import ChatLayer, ServerDefaults
from kinetic.chat.templates import ChatTemplate, builtin_template
from kinetic.chat.types import ChatRequest, Message, TextPart
from kinetic.engine.llama.host_cache import HostPrefixCache
from kinetic.engine.text import common_prefix
from tests.scripted import ScriptedEngine


def cache_with(keys: list[tuple[int, ...]], *, exact: bool) -> HostPrefixCache:
    cache = HostPrefixCache(ctx=None, budget_bytes=1 << 20, exact=exact)  # type: ignore[arg-type]
    for key in keys:
        cache._keep(key, bytearray(b"state"), ())
    return cache


def test_a_state_cut_to_a_shorter_prefix_serves_only_attention_models() -> None:
    prompt = [1, 2, 3, 4, 9, 9]
    longer = (1, 2, 3, 4, 5, 6, 7)  # parts from the prompt at its fifth token
    assert cache_with([longer], exact=False).longest_prefix(prompt, limit=5) == (longer, 4)
    assert cache_with([longer], exact=True).longest_prefix(prompt, limit=5) == (None, 0)


def test_an_exact_state_serves_a_prompt_that_starts_with_all_of_it() -> None:
    whole, longer = (1, 2, 3), (1, 2, 3, 4, 5, 6, 7)
    cache = cache_with([longer, whole], exact=True)
    assert cache.longest_prefix([1, 2, 3, 4, 9], limit=4) == (whole, 3)
    # the last prompt token is evaluated again for its logits: a state holding all of the prompt is no use
    assert cache.longest_prefix([1, 2, 3], limit=2) == (None, 0)
    assert cache.longest_match([1, 2, 3, 4, 5, 0]) == 5


def chat_layer(memory_kind: str) -> ChatLayer:
    engine = ScriptedEngine([])
    engine.loaded.set()
    engine.load()
    engine.info = replace(engine.info, memory_kind=memory_kind)
    return ChatLayer(engine, ChatTemplate(builtin_template("chatml"), "builtin:chatml"), ServerDefaults())


def test_the_chat_layer_marks_where_the_last_message_starts_on_hybrid_models() -> None:
    messages = (Message(role="system", parts=(TextPart("You are the course assistant."),)),
                Message(role="user", parts=(TextPart("What is a slot?"),)))
    generation, _ = chat_layer("hybrid").prepare_chat(ChatRequest(messages=messages))
    start = generation.checkpoint_at
    prompt = bytes(generation.prompt_tokens)  # the scripted engine's tokens are the text's bytes
    assert prompt[:start].decode().endswith("You are the course assistant.<|im_end|>\n")
    assert prompt[start:].decode().startswith("<|im_start|>user\nWhat is a slot?")
    attention, _ = chat_layer("attention").prepare_chat(ChatRequest(messages=messages))
    assert attention.checkpoint_at == 0  # nothing more is rendered for the models that need no checkpoint


def test_a_state_dropped_after_it_was_found_is_not_restored() -> None:
    """A save between a lookup and its restore may drop the state found (the budget, a superseded prefix): the
    restore then says no, and the prompt is read in full, instead of failing the request (an hour's soak met it)."""
    cache = cache_with([(1, 2, 3)], exact=False)
    found, n = cache.longest_prefix([1, 2, 3, 4], limit=3)
    assert found == (1, 2, 3) and n == 3
    cache._drop(found)
    assert cache.restore(found, seq_id=0) is False


def scanned_prefix(cache: HostPrefixCache, prompt: list[int], limit: int, tag: tuple[float, ...]) -> int:
    """longest_prefix's length as every key compared in turn gives it."""
    best = 0
    for key, key_tag in cache.tags.items():
        n = common_prefix(key, prompt)
        if key_tag != tag or (cache.exact and (n < len(key) or n > limit)):
            continue
        best = max(best, min(n, limit))
    return best


def test_the_lookups_find_what_comparing_every_key_finds() -> None:
    """The cache finds a prompt's longest saved prefix by the keys' order and lengths (not a scan of every key,
    3.5 ms at 512 entries): on random keys over a small alphabet, with tags, drops and every limit, it finds
    the same lengths a scan finds, and a key that has them."""
    rng = random.Random(7)
    for exact in (True, False):
        cache = HostPrefixCache(ctx=None, budget_bytes=1 << 30, exact=exact)  # type: ignore[arg-type]
        for round_ in range(400):
            tag = rng.choice([(), (), (0.5,)])
            key = tuple(rng.randrange(3) for _ in range(rng.randrange(1, 12)))
            if key not in cache.entries:
                cache._keep(key, bytearray(b"s"), tag)
            if round_ % 5 == 0:
                cache._drop(rng.choice(list(cache.entries)))
            prompt = [rng.randrange(3) for _ in range(rng.randrange(1, 14))]
            for limit in range(len(prompt) + 1):
                found, n = cache.longest_prefix(prompt, limit, tag)
                assert n == scanned_prefix(cache, prompt, limit, tag), (exact, prompt, limit)
                if found is not None:
                    assert cache.tags[found] == tag and min(common_prefix(found, prompt), limit) == n
                    assert not exact or len(found) == n
            whole = max((common_prefix(k, prompt) for k, t in cache.tags.items() if t == tag), default=0)
            assert cache.longest_match(prompt, tag) == whole
        assert sorted(cache._ordered[()] + cache._ordered.get((0.5,), [])) == sorted(cache.entries)
        assert sum(sum(c.values()) for c in cache._lengths.values()) == len(cache.entries)


def test_a_longer_state_supersedes_its_saved_prefixes_by_length() -> None:
    cache = cache_with([(1, 2), (1, 2, 3), (1, 9), (1, 2, 3, 4, 5)], exact=False)
    cache._keep((1, 2, 3, 4, 5, 6), bytearray(b"other"), (0.5,))
    assert list(cache._prefixes_of((1, 2, 3, 4, 5, 6), (), below=6)) == [(1, 2, 3, 4, 5), (1, 2, 3), (1, 2)]
    assert list(cache._prefixes_of((1, 2, 3, 4, 5, 6), (), below=4)) == [(1, 2, 3), (1, 2)]
    assert list(cache._prefixes_of((1, 2, 3, 4, 5, 6, 7), (0.5,), below=7)) == [(1, 2, 3, 4, 5, 6)]


def test_the_conversation_before_the_question_is_tokenized_once() -> None:
    """A class's first turns share everything before the student's question: the chat layer tokenizes that once,
    not on every request (0.86 ms of the event loop a chat with the lab's system prompt), and finds the same start."""
    layer = chat_layer("hybrid")
    texts: list[str] = []
    tokenize = layer.engine.tokenize
    layer.engine.tokenize = lambda text, **kw: texts.append(text) or tokenize(text, **kw)  # type: ignore[method-assign]
    system = Message(role="system", parts=(TextPart("You are the course assistant."),))
    starts = []
    for question in ("What is a slot?", "What is a KV cache?", "Why does the prompt cost?"):
        generation, _ = layer.prepare_chat(ChatRequest(messages=(system, Message(role="user",
                                                                                 parts=(TextPart(question),)))))
        starts.append(generation.checkpoint_at)
    earlier = [text for text in texts if "user" not in text]
    # the conversation before the question once, each prompt once, and the first question's turn alone once: the
    # scripted vocabulary has no special tokens, so the template's markers are text and a prompt is never cut there
    # (tests/unit/test_conversation_tokens.py)
    assert len(earlier) == 1 and len(texts) == 5 and texts[0].startswith("<|im_start|>user")
    assert len(set(starts)) == 1 and starts[0] > 0
