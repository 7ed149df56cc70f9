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

import bisect
import ctypes
from collections import Counter, OrderedDict
from collections.abc import Iterator

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
        # Every admission looks the prompt up here, on the decode thread while no stream steps: with a class's
        # checkpoints (up to 32 a slot) a scan comparing each key took 3.5 ms at 512 entries. Per tag, the keys in
        # order (the longest common prefix with any key is one with a neighbour of the prompt's place among them)
        # and how many keys there are of each length (a state that all starts the prompt is found by its length).
        self._ordered: dict[tuple[float, ...], list[tuple[int, ...]]] = {}
        self._lengths: dict[tuple[float, ...], Counter[int]] = {}

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
            for old in list(self._prefixes_of(key, tag, below=len(key))):
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
        self._keep(key, state, tag)
        while self.entries and (self.size > self.budget or 0 < self.max_entries < len(self.entries)):
            self._drop(next(iter(self.entries)))

    def _keep(self, key: tuple[int, ...], state: bytearray, tag: tuple[float, ...]) -> None:
        self.entries[key] = state
        self.tags[key] = tag
        self.size += len(state)
        bisect.insort(self._ordered.setdefault(tag, []), key)
        self._lengths.setdefault(tag, Counter())[len(key)] += 1

    def _drop(self, key: tuple[int, ...]) -> None:
        self.size -= len(self.entries.pop(key))
        tag = self.tags.pop(key, ())
        ordered = self._ordered[tag]
        del ordered[bisect.bisect_left(ordered, key)]
        lengths = self._lengths[tag]
        lengths[len(key)] -= 1
        if not lengths[len(key)]:
            del lengths[len(key)]

    def _prefixes_of(self, tokens: tuple[int, ...], tag: tuple[float, ...], *, below: int) -> Iterator[tuple[int, ...]]:
        """The keys of tag `tag` that `tokens` starts with, shorter than `below`, longest first."""
        for length in sorted((n for n in self._lengths.get(tag, ()) if n < below and n <= len(tokens)), reverse=True):
            key = tokens[:length]
            if self.tags.get(key) == tag:
                yield key

    def _longest_common(self, target: tuple[int, ...], tag: tuple[float, ...]) -> tuple[tuple[int, ...] | None, int]:
        """The key of tag `tag` sharing the longest prefix with `target`, and how long: one of the two keys beside
        `target`'s place in order shares the most."""
        ordered = self._ordered.get(tag, [])
        place = bisect.bisect_left(ordered, target)
        best: tuple[int, ...] | None = None
        n_best = 0
        for key in ordered[max(0, place - 1):place + 1]:
            n = common_prefix(key, target)
            if n > n_best:
                best, n_best = key, n
        return best, n_best

    def longest_prefix(self, prompt: list[int], limit: int,
                       tag: tuple[float, ...] = ()) -> tuple[tuple[int, ...] | None, int]:
        """The saved state of tag `tag` sharing the longest prefix with `prompt` (at most `limit` tokens); when
        exact, only a state whose tokens all start the prompt counts."""
        target = tuple(prompt)
        if self.exact:
            found = next(self._prefixes_of(target, tag, below=limit + 1), None)
            return (found, len(found)) if found is not None else (None, 0)
        best, n = self._longest_common(target, tag)
        return (best, min(n, limit)) if best is not None and limit > 0 else (None, 0)

    def longest_match(self, prompt: list[int], tag: tuple[float, ...] = ()) -> int:
        """How many first tokens of `prompt` the longest saved state of tag `tag` shares with it, whole or not."""
        return self._longest_common(tuple(prompt), tag)[1]

    def restore(self, key: tuple[int, ...], seq_id: int) -> bool:
        """Loads a saved state into sequence `seq_id` (which must be empty); False if llama.cpp refused, or if the
        state is gone (dropped since it was found)."""
        state = self.entries.get(key)
        if state is None:
            return False
        self.entries.move_to_end(key)
        buffer = (ctypes.c_uint8 * len(state)).from_buffer(state)
        return llama_cpp.llama_state_seq_set_data(self.ctx.ctx, buffer, len(state), seq_id) > 0
