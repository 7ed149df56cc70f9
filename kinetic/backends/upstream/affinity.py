"""Which pool member most likely holds a request's prompt in its cache: cache-affine routing.

A llama-server or kinetic member keeps each slot's KV cache, so a conversation's next turn is cheap on
the member that answered its last one (it evaluates only the new message) and dear on any other (the
whole history again: about 360 ms against 3,550 ms for a 2.6k-token history in LeenHawk/gproxy#161).

A prompt is read as a chain of hashes, one link per message (a block of text for a raw prompt): first
the leading system messages (the lab's system prompt, which every student sends: the *shared* prefix),
then the rest chained on the caller's key (the *conversation*). Every member that answers a request
records the links it now holds. A request then goes, as vllm-router's and SGLang's cache-aware policy
send it, to the member whose record shares the longest prefix with it when that share of the prompt
is above the cache threshold (0.3), unless that member has more than the absolute balance threshold
(64) requests over the idlest member and more than the relative one (1.5) times as many; then to the
least loaded.

Where kinetic parts from those routers: their record holds raw prefixes, so the lab's system prompt
and first question, the same for every student, make the first member that answered it the holder of
every new conversation, and the class piles on it while the others idle (vLLM's production stack says
as much of prefix routing: "the hot instance queues while its peers sit idle"). Here the key is in the
conversation's links, so only a student's own history binds; a new conversation goes to the least
loaded member, of equals the one holding the fewest conversations (their "smallest record"), then one
that holds the shared prefix already. Every member holds the system prompt after its first request of
the class; a history is held by one member only.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Policy = Literal["cache-aware", "least-outstanding"]
POLICIES: tuple[Policy, ...] = ("cache-aware", "least-outstanding")
Reason = Literal["affine", "spilled", "moved", "new", "least-loaded"]

SHARED_ROLES = frozenset({"system", "developer"})
TEXT_BLOCK = 256  # characters per link of a raw text prompt: prompts that start alike share links
TOKEN_BLOCK = 64  # tokens per link of a token-list prompt
CHARS_PER_TOKEN = 4  # a token-list prompt's size in the same unit as a text one (the share is a ratio)
MAX_LINKS = 200_000  # links remembered (LRU): about 40 MB at most, thousands of conversations
CONVERSATION_IDLE_S = 600.0  # a conversation silent this long no longer counts as held by its member


@dataclass(frozen=True)
class PoolPolicy:
    """How a pool picks a member (--upstream-policy and its bounds; vllm-router's defaults)."""

    policy: Policy = "cache-aware"
    cache_threshold: float = 0.3
    balance_abs: int = 64
    balance_rel: float = 1.5
    probe_interval_s: float = 10.0

    def over_bound(self, load: float, least: float) -> bool:
        """Whether a member this loaded should give its request to the idlest member (`least`)."""
        return load - least > self.balance_abs and load > self.balance_rel * least


@dataclass(frozen=True)
class PromptPrint:
    """A prompt's links: `links[i]` is the hash of its first i+1 units, `ends[i]` their size in
    characters; the first `shared` links are the unkeyed shared prefix, the rest the conversation's.
    `assistant[i]` says unit i is an answer (its member generated it, so holds it too)."""

    links: tuple[bytes, ...]
    ends: tuple[int, ...]
    assistant: tuple[bool, ...]
    shared: int

    @property
    def total(self) -> int:
        return self.ends[-1] if self.ends else 0

    @property
    def conversation(self) -> bytes | None:
        """The conversation's first link (the key, the shared prefix and the first question)."""
        return self.links[self.shared] if len(self.links) > self.shared else None


def _chain(previous: bytes, unit: bytes) -> bytes:
    return hashlib.blake2b(previous + unit, digest_size=16).digest()


def _units(payload: Mapping[str, Any]) -> tuple[list[tuple[bytes, int, bool]], int]:
    """(bytes, size, is an answer) per unit of a forwarded body, and how many lead as the shared prefix."""
    messages = payload.get("messages")
    if isinstance(messages, list):
        units = [(text.encode(), len(text), isinstance(m, dict) and m.get("role") == "assistant")
                 for m in messages for text in [json.dumps(m, sort_keys=True, ensure_ascii=False)]]
        shared = next((i for i, m in enumerate(messages)
                       if not (isinstance(m, dict) and m.get("role") in SHARED_ROLES)), len(messages))
        return units, shared
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return [(prompt[i:i + TEXT_BLOCK].encode(), len(prompt[i:i + TEXT_BLOCK]), False)
                for i in range(0, len(prompt), TEXT_BLOCK)], 0
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return [(json.dumps(prompt[i:i + TOKEN_BLOCK]).encode(), len(prompt[i:i + TOKEN_BLOCK]) * CHARS_PER_TOKEN,
                 False) for i in range(0, len(prompt), TOKEN_BLOCK)], 0
    return [], 0  # several prompts at once, embeddings: no one prefix to follow


def prompt_print(payload: Mapping[str, Any], client: str) -> PromptPrint | None:
    """The links of a forwarded body for `client` (a key's name); None when it has no prompt to follow."""
    units, shared = _units(payload)
    if not units:
        return None
    links: list[bytes] = []
    ends: list[int] = []
    link, end = str(payload.get("model", "")).encode(), 0
    for index, (unit, size, _) in enumerate(units):
        if index == shared:  # the conversation's links carry the key: one student's history binds
            link = _chain(link, b"\x00key\x00" + client.encode())
        link, end = _chain(link, unit), end + size
        links.append(link)
        ends.append(end)
    return PromptPrint(links=tuple(links), ends=tuple(ends), assistant=tuple(u[2] for u in units), shared=shared)


@dataclass(frozen=True)
class Holder:
    member: int
    matched: int  # characters of the prompt the member holds


class AffinityTable:
    """Who holds which links: the conversations' (one member each, the one that answered last) and the
    shared prefixes' (every member that answered one), each remembered LRU."""

    def __init__(self, max_links: int = MAX_LINKS, idle_s: float = CONVERSATION_IDLE_S):
        self.max_links = max_links
        self.idle_s = idle_s
        self._held: OrderedDict[bytes, int] = OrderedDict()
        self._shared: OrderedDict[bytes, set[int]] = OrderedDict()
        self._conversations: OrderedDict[bytes, tuple[int, float]] = OrderedDict()  # first link: member, when
        self.conversations: Counter[int] = Counter()  # conversations each member holds

    def holder(self, fp: PromptPrint) -> Holder | None:
        """The member holding the longest part of the conversation, and how much of the prompt that is:
        its links, and the answer after them (generated there)."""
        for index in range(len(fp.links) - 1, fp.shared - 1, -1):
            member = self._held.get(fp.links[index])
            if member is not None:
                after = index + 1
                matched = fp.ends[after] if after < len(fp.links) and fp.assistant[after] else fp.ends[index]
                return Holder(member, matched)
        return None

    def shared_match(self, fp: PromptPrint, member: int) -> int:
        """Characters of the shared prefix `member` holds."""
        for index in range(fp.shared - 1, -1, -1):
            if member in self._shared.get(fp.links[index], ()):
                return fp.ends[index]
        return 0

    def record(self, fp: PromptPrint, member: int, now: float | None = None) -> None:
        """`member` answered `fp`: it now holds its links (a conversation moves to it)."""
        now = time.monotonic() if now is None else now
        for link in fp.links[:fp.shared]:
            self._shared.setdefault(link, set()).add(member)
            self._shared.move_to_end(link)
        for link in fp.links[fp.shared:]:
            self._held[link] = member
            self._held.move_to_end(link)
        first = fp.conversation
        if first is not None:
            previous = self._conversations.pop(first, None)
            if previous is not None:
                self.conversations[previous[0]] -= 1
            self._conversations[first] = (member, now)
            self.conversations[member] += 1
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._conversations:
            first, (member, at) = next(iter(self._conversations.items()))
            if now - at < self.idle_s and len(self._conversations) <= self.max_links:
                break
            del self._conversations[first]
            self.conversations[member] -= 1
        for table in (self._held, self._shared):
            while len(table) > self.max_links:
                table.popitem(last=False)

    def forget(self, member: int) -> None:
        """`member` went down: whatever it held is gone with its cache, and its conversations move."""
        self._held = OrderedDict((link, m) for link, m in self._held.items() if m != member)
        for holders in self._shared.values():
            holders.discard(member)
        self._conversations = OrderedDict((first, held) for first, held in self._conversations.items()
                                          if held[0] != member)
        self.conversations[member] = 0

    def route(self, fp: PromptPrint | None, loads: Mapping[int, float],
              policy: PoolPolicy) -> tuple[list[int], Reason]:
        """The members of `loads` (the available ones, with their loads) in the order to try them, and why
        the first: it holds the conversation (affine), it did but is over the bound (spilled) or gone
        (moved), the conversation is new, or the policy looks at load alone."""
        by_load = sorted(loads, key=lambda m: (loads[m], m))
        if policy.policy == "least-outstanding" or fp is None or not by_load:
            return by_load, "least-loaded"
        found = self.holder(fp)
        reason: Reason = "new"
        if found is not None and found.matched > policy.cache_threshold * fp.total:
            if found.member not in loads:
                reason = "moved"
            elif policy.over_bound(loads[found.member], loads[by_load[0]]):
                reason = "spilled"
            else:
                return [found.member, *(m for m in by_load if m != found.member)], "affine"
        order = sorted(loads, key=lambda m: (loads[m], self.conversations[m], -self.shared_match(fp, m), m))
        return order, reason
