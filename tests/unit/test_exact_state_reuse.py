"""Reuse on hybrid and recurrent models (docs/models.md), in the parts that need no model: which saved
state may serve a prompt, and where the chat layer says a conversation's shared prefix ends."""

from __future__ import annotations

from dataclasses import replace

from kinetic.chat.prepare import ChatLayer, ServerDefaults
from kinetic.chat.templates import ChatTemplate, builtin_template
from kinetic.chat.types import ChatRequest, Message, TextPart
from kinetic.engine.llama.host_cache import HostPrefixCache
from tests.scripted import ScriptedEngine


def cache_with(keys: list[tuple[int, ...]], *, exact: bool) -> HostPrefixCache:
    cache = HostPrefixCache(ctx=None, budget_bytes=1 << 20, exact=exact)  # type: ignore[arg-type]
    for key in keys:
        cache.entries[key] = b"state"
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
    cache.entries.pop(found)
    assert cache.restore(found, seq_id=0) is False
