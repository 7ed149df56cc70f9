"""The n-gram drafters of llama.cpp's speculative decoding beside ngram-simple: drafts from the tokens a slot has
already seen, never from a second model (common/ngram-map.cpp, ngram-mod.cpp, ngram-cache.cpp, speculative.cpp).

- `ngram-map-k`: the last n tokens are looked up among the earlier ones that a whole m-gram follows; the m-gram
  after the latest match is the draft, cut to as many tokens as the last draft of that key had accepted.
- `ngram-map-k4v`: as map-k, but each key keeps up to four different m-grams seen after it with their counts,
  and drafts only when the key was seen at least min-hits times and one m-gram is at least twice as frequent as
  all the others together.
- `ngram-mod`: one hash table shared by every slot, from each n_match-gram (its LCG hash modulo 4M entries) to
  the token that followed it; the draft chains look-ups from the last n_match tokens, at most n_max tokens, and
  is dropped when shorter than n_min. The table is cleared when a quarter full, and after five drafts in a row
  of which under a quarter was accepted.
- `ngram-cache`: llama.cpp's lookup decoding: counts of the token after every 1- to 4-gram the slot has seen;
  the longest n-gram whose counts make one token frequent enough (llama.cpp's lax thresholds) drafts it, up to
  8 tokens. (llama-server's static and dynamic caches, read from files, are not loaded: only the context's.)

Whatever a drafter proposes, the verification keeps only the tokens the slot's own sampler picks, so the output
is token for token that of decoding without speculation; the kinds differ only in how many of their guesses hold.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from kinetic.engine.options import SpecOptions

MAP_MAX_VALUES = 4  # COMMON_NGRAM_MAX_VALUES: m-grams remembered per key (k4v)
MAP_MAX_COUNT = 16380  # COMMON_NGRAM_MAX_VALUE_COUNT
MOD_SIZE = 4 * 1024 * 1024  # common_ngram_mod's entries
MOD_HASH = 6364136223846793005  # its LCG multiplier
MOD_RESET_OCCUPANCY = 0.25
MOD_ADD_CHUNK = 32  # new n-grams are added once this many tokens came since the last addition
MOD_LOW_ACCEPTANCE, MOD_LOW_STREAK = 0.25, 5
CACHE_NGRAM_MIN, CACHE_NGRAM_MAX = 1, 4  # LLAMA_NGRAM_MIN, LLAMA_NGRAM_MAX
CACHE_N_DRAFT = 8  # llama-server's fixed ngram-cache draft length
CACHE_MIN_SAMPLES = (2, 2, 1, 1)  # draft_min_sample_size_lax, by n-gram size
CACHE_MIN_PERCENT = (66, 50, 50, 50)  # draft_min_percent_lax
MASK64 = (1 << 64) - 1


class Drafter(Protocol):
    """One kind of n-gram drafting over every slot (sequence) of the scheduler."""

    def begin(self, seq: int, prompt: list[int]) -> None: ...

    def draft(self, seq: int, history: list[int], last: int) -> list[int]: ...

    def accepted(self, seq: int, n_accepted: int) -> None: ...


def _matches(tokens: list[int], start: int, pattern: list[int]) -> bool:
    return tokens[start] == pattern[0] and tokens[start:start + len(pattern)] == pattern


@dataclass
class _Key:
    """A key n-gram's statistics (common_ngram_map_key): its count and the m-grams seen after it."""

    key_num: int = 0
    stat_idx: int = 0  # history scanned for values up to here
    values: list[list[int]] = field(default_factory=list)  # [value_idx, value_num, n_accepted]


class NgramMap:
    """`ngram-map-k` (key_only) and `ngram-map-k4v`, one map per sequence, rebuilt when a slot takes a new job."""

    def __init__(self, *, size_n: int, size_m: int, min_hits: int, key_only: bool):
        self.n, self.m, self.min_hits, self.key_only = size_n, size_m, min_hits, key_only
        self.keys: dict[int, dict[tuple[int, ...], _Key]] = {}
        self.last: dict[int, list[int] | None] = {}  # the value statistics the last draft of a sequence used

    def begin(self, seq: int, prompt: list[int]) -> None:
        self.keys[seq], self.last[seq] = {}, None

    def draft(self, seq: int, history: list[int], last: int) -> list[int]:
        n, m = self.n, self.m
        self.last[seq] = None
        size = len(history)
        if size < 2 * n + m:
            return []
        pattern = history[size - n + 1:] + [last]
        # the latest earlier key that a whole m-gram follows (position 0 never counts, as in llama.cpp)
        match = next((j for j in range(size - n - m - 1, 0, -1) if _matches(history, j, pattern)), 0)
        if not match:
            return []
        key = self.keys.setdefault(seq, {}).setdefault(tuple(pattern), _Key())
        key.key_num = min(key.key_num + 1, MAP_MAX_COUNT)
        if not key.values:
            key.values.append([0, 0, m])
        if self.key_only:
            chosen = key.values[0]
        else:
            if key.key_num < self.min_hits:
                return []
            self._count_values(key, history, pattern, match)
            chosen = max(key.values, key=lambda value: value[1])
            others = sum(value[1] for value in key.values if value is not chosen)
            if others > 0 and chosen[1] < 2 * others:
                return []
        self.last[seq] = chosen
        return history[match + n:match + n + min(m, chosen[2])]

    def _count_values(self, key: _Key, history: list[int], pattern: list[int], match: int) -> None:
        """The m-grams after every occurrence of the key since the last count (common_ngram_map_draft's)."""
        n, m = self.n, self.m
        for i in range(key.stat_idx, match + 1):
            if not _matches(history, i, pattern):
                continue
            begin = i + n
            for value in key.values:
                if value[0] == 0:
                    value[:] = [begin, 1, m]
                    break
                if history[begin:begin + m] == history[value[0]:value[0] + m]:
                    value[1] = min(value[1] + 1, MAP_MAX_COUNT)
                    break
            else:
                if len(key.values) < MAP_MAX_VALUES:
                    key.values.append([begin, 1, m])
        key.stat_idx = match

    def accepted(self, seq: int, n_accepted: int) -> None:
        value = self.last.get(seq)
        if value is not None:
            value[2] = n_accepted


@dataclass
class _ModSeq:
    i_last: int = 0  # history added to the table up to here
    n_draft_last: int = 0
    n_low: int = 0


class NgramMod:
    """`ngram-mod`: the table shared by every sequence (common_ngram_mod), kept as a dict of its used entries."""

    def __init__(self, *, n_match: int, n_min: int, n_max: int):
        self.n, self.n_min, self.n_max = n_match, n_min, n_max
        self.entries: dict[int, int] = {}
        self.seqs: dict[int, _ModSeq] = {}

    def _index(self, tokens: list[int], start: int) -> int:
        res = 0
        for token in tokens[start:start + self.n]:
            res = (res * MOD_HASH + token) & MASK64
        return res % MOD_SIZE

    def _add(self, tokens: list[int], start: int, end: int) -> None:
        for i in range(start, end):
            self.entries[self._index(tokens, i)] = tokens[i + self.n]

    def begin(self, seq: int, prompt: list[int]) -> None:
        state = self.seqs[seq] = _ModSeq()
        if len(prompt) < self.n:
            return
        self._add(prompt, 0, len(prompt) - self.n)
        state.i_last = len(prompt) - self.n
        if len(self.entries) / MOD_SIZE > MOD_RESET_OCCUPANCY:
            self.entries.clear()

    def draft(self, seq: int, history: list[int], last: int) -> list[int]:
        state = self.seqs.setdefault(seq, _ModSeq())
        state.n_draft_last = 0
        n, size = self.n, len(history)
        if size < n:
            return []
        if state.i_last + MOD_ADD_CHUNK < size:
            self._add(history, state.i_last, size - n)
            state.i_last = size - n
        window = history[size - n + 1:] + [last]
        drafted: list[int] = []
        for i in range(self.n_max):
            token = self.entries.get(self._index(window, i))
            if token is None:
                if i < self.n_min:
                    return []
                break
            window.append(token)
            drafted.append(token)
        state.n_draft_last = len(drafted)
        return drafted

    def accepted(self, seq: int, n_accepted: int) -> None:
        state = self.seqs.get(seq)
        if state is None or state.n_draft_last <= 0:
            return
        if n_accepted / state.n_draft_last < MOD_LOW_ACCEPTANCE:
            state.n_low += 1
            if state.n_low >= MOD_LOW_STREAK:
                self.entries.clear()
                state.n_low, state.i_last = 0, 0
        else:
            state.n_low = 0


@dataclass
class _CacheSeq:
    size: int = 0  # history counted so far
    counts: dict[tuple[int, ...], Counter[int]] = field(default_factory=dict)


class NgramCache:
    """`ngram-cache`: per sequence, the tokens seen after each 1- to 4-gram of its history, counted."""

    def __init__(self) -> None:
        self.seqs: dict[int, _CacheSeq] = {}

    def begin(self, seq: int, prompt: list[int]) -> None:
        self.seqs[seq] = _CacheSeq()

    def _update(self, state: _CacheSeq, tokens: list[int], n_new: int) -> None:
        """common_ngram_cache_update over the last `n_new` tokens of `tokens`."""
        size = len(tokens)
        for ngram in range(CACHE_NGRAM_MIN, CACHE_NGRAM_MAX + 1):
            for i in range(max(size - n_new, ngram), size):
                state.counts.setdefault(tuple(tokens[i - ngram:i]), Counter())[tokens[i]] += 1

    def draft(self, seq: int, history: list[int], last: int) -> list[int]:
        state = self.seqs.setdefault(seq, _CacheSeq())
        tokens = history + [last]
        if state.size < len(tokens):
            # the tokens since the last update: llama-server counts only the new part of its history, once each
            self._update(state, tokens, len(tokens) - state.size)
            state.size = len(tokens)
        if len(tokens) < 2:  # LLAMA_NGRAM_STATIC
            return []
        drafted: list[int] = []
        while len(drafted) < CACHE_N_DRAFT:
            token = self._next(state, tokens + drafted)
            if token is None:
                break
            drafted.append(token)
        return drafted

    @staticmethod
    def _next(state: _CacheSeq, tokens: list[int]) -> int | None:
        """The lax context thresholds of llama.cpp's try_draft, longest n-gram first."""
        for ngram in range(CACHE_NGRAM_MAX, CACHE_NGRAM_MIN - 1, -1):
            counts = state.counts.get(tuple(tokens[-ngram:]))
            if not counts:
                continue
            token, best = max(counts.items(), key=lambda item: item[1])
            total = sum(counts.values())
            if total >= CACHE_MIN_SAMPLES[ngram - 1] and 100 * best >= CACHE_MIN_PERCENT[ngram - 1] * total:
                return token
        return None

    def accepted(self, seq: int, n_accepted: int) -> None:
        return None  # llama.cpp's ngram-cache learns nothing from verification


def make_drafters(options: SpecOptions) -> dict[str, Drafter]:
    """The n-gram drafters the options ask for (other than ngram-simple), in llama.cpp's order of preference."""
    made: dict[str, Drafter] = {}
    for kind in options.types:
        if kind == "ngram-map-k":
            made[kind] = NgramMap(size_n=options.map_k.size_n, size_m=options.map_k.size_m,
                                  min_hits=options.map_k.min_hits, key_only=True)
        elif kind == "ngram-map-k4v":
            made[kind] = NgramMap(size_n=options.map_k4v.size_n, size_m=options.map_k4v.size_m,
                                  min_hits=options.map_k4v.min_hits, key_only=False)
        elif kind == "ngram-mod":
            made[kind] = NgramMod(n_match=options.mod_n_match, n_min=options.mod_n_min, n_max=options.mod_n_max)
        elif kind == "ngram-cache":
            made[kind] = NgramCache()
    order = ("ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
    return {kind: made[kind] for kind in order if kind in made}
