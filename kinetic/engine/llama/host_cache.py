"""Prompt prefixes kept in host memory after their slot moved on (llama-server's --cache-ram).

A slot holds one prompt's KV cells. When a new request takes the slot and shares little with it,
those cells would be lost; with thirty students and four slots the lab's system prompt is lost
again and again. Before a slot's cells are dropped, its sequence state is saved here (up to a
budget in MiB, least recently used out first); a later prompt that starts the same way gets the
state restored into its slot instead of evaluating the prefix again.

On a hybrid or recurrent model (`exact`) a saved state is valid at exactly the tokens it was saved
with: its recurrent layers cannot be rolled back to a shorter prefix. Then only a state whose tokens
all start the prompt is restored, a longer state never stands in for a shorter one, and the
scheduler also saves states at chosen positions inside prompts (its checkpoints, as llama-server's
context checkpoints), so that there is a state to restore where prompts part ways.

A state is valid only under the LoRA adapter scales it was computed with (requests may bring their own): each
entry carries them as its `tag`, and a prompt is only ever given a state of its own tag.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict

import llama_cpp
from llama_cpp import _internals

from kinetic.engine.text import common_prefix

# Saving pays off only for a real shared prefix, not a BOS and a few tokens.
MIN_SAVED_TOKENS = 16


class HostPrefixCache:
    """Sequence states by the tokens they hold; `budget_bytes` 0 turns it off."""

    def __init__(self, ctx: _internals.LlamaContext, budget_bytes: int, *, exact: bool = False,
                 max_entries: int = 0):
        self.ctx = ctx
        self.budget = budget_bytes
        self.exact = exact
        self.max_entries = max_entries  # 0: as many as the budget holds
        # bytearrays: llama.cpp writes into one and reads back from it, with no copy of a state (tens of MiB
        # on a hybrid model) on the way in or out
        self.entries: OrderedDict[tuple[int, ...], bytearray] = OrderedDict()
        self.tags: dict[tuple[int, ...], tuple[float, ...]] = {}  # each entry's adapter scales
        self.size = 0

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def save(self, seq_id: int, tokens: list[int], tag: tuple[float, ...] = (), *,
             min_tokens: int = MIN_SAVED_TOKENS) -> None:
        """Keeps the state of sequence `seq_id`, which holds exactly `tokens` computed under adapter scales `tag`
        (unless it holds fewer than `min_tokens`)."""
        key = tuple(tokens)
        if key in self.entries and self.tags.get(key, ()) != tag:
            self._drop(key)
        if self.budget <= 0 or len(key) < max(1, min_tokens) or key in self.entries:
            if key in self.entries:
                self.entries.move_to_end(key)
            return
        if not self.exact:  # a saved prefix of this one is superseded: the longer state serves it too
            for old in [k for k in self.entries
                        if len(k) < len(key) and key[:len(k)] == k and self.tags.get(k, ()) == tag]:
                self._drop(old)
        n_bytes = llama_cpp.llama_state_seq_get_size(self.ctx.ctx, seq_id)
        if n_bytes <= 0 or n_bytes > self.budget:
            return
        state = bytearray(n_bytes)
        view = (ctypes.c_uint8 * n_bytes).from_buffer(state)
        written = llama_cpp.llama_state_seq_get_data(self.ctx.ctx, view, n_bytes, seq_id)
        del view  # the array holds the bytearray's buffer: it must go before the bytearray can shrink
        if written <= 0:
            return
        if written < n_bytes:
            del state[written:]
        self.entries[key] = state
        self.tags[key] = tag
        self.size += written
        while self.entries and (self.size > self.budget or 0 < self.max_entries < len(self.entries)):
            self._drop(next(iter(self.entries)))

    def _drop(self, key: tuple[int, ...]) -> None:
        self.size -= len(self.entries.pop(key))
        self.tags.pop(key, None)

    def longest_prefix(self, prompt: list[int], limit: int,
                       tag: tuple[float, ...] = ()) -> tuple[tuple[int, ...] | None, int]:
        """The saved state of tag `tag` sharing the longest prefix with `prompt` (at most `limit` tokens); when
        exact, only a state whose tokens all start the prompt counts."""
        best: tuple[int, ...] | None = None
        n_best = 0
        for key in self.entries:
            if self.tags.get(key, ()) != tag:
                continue
            n = common_prefix(key, prompt)
            if self.exact and (n < len(key) or n > limit):
                continue
            n = min(n, limit)
            if n > n_best:
                best, n_best = key, n
        return best, n_best

    def longest_match(self, prompt: list[int], tag: tuple[float, ...] = ()) -> int:
        """How many first tokens of `prompt` the longest saved state of tag `tag` shares with it, whole or not."""
        return max((common_prefix(key, prompt) for key in self.entries if self.tags.get(key, ()) == tag), default=0)

    def restore(self, key: tuple[int, ...], seq_id: int) -> bool:
        """Loads a saved state into sequence `seq_id` (which must be empty); False if llama.cpp refused, or if the
        state is gone (dropped since it was found)."""
        state = self.entries.get(key)
        if state is None:
            return False
        self.entries.move_to_end(key)
        buffer = (ctypes.c_uint8 * len(state)).from_buffer(state)
        return llama_cpp.llama_state_seq_set_data(self.ctx.ctx, buffer, len(state), seq_id) > 0
