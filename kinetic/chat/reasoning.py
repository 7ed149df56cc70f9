"""Splitting <think>...</think> out of generated text into reasoning_content, as it streams."""

from __future__ import annotations

from kinetic.engine.text import held_suffix

REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")
OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"


class ReasoningSplitter:
    """Feed text deltas; get (reasoning, content) pieces back.

    `starts_inside` is true when the prompt already opened a <think> block (templates of thinking
    models end the generation prompt with `<think>\\n`). With format `none` everything is content;
    `deepseek-legacy` keeps the tags in the content and also fills the reasoning.
    """

    def __init__(self, reasoning_format: str = "auto", *, starts_inside: bool = False,
                 also_ends: tuple[str, ...] = ()):
        """`also_ends`: texts that end an open think block too and stay in the content (Qwen3.5 may
        start its `<tool_call>` without closing the block, and llama-server reads it so)."""
        self.format = reasoning_format
        self.inside = starts_inside and reasoning_format != "none"
        self.also_ends = also_ends
        self._buffer = ""
        self._content_started = False
        self._reasoning_started = False

    def push(self, text: str) -> tuple[str, str]:
        if self.format == "none":
            return "", text
        self._buffer += text
        reasoning: list[str] = []
        content: list[str] = []
        while self._buffer:
            tag = CLOSE_TAG if self.inside else OPEN_TAG
            index = self._buffer.find(tag)
            ender = min(((i, e) for e in self.also_ends if self.inside and (i := self._buffer.find(e)) >= 0),
                        default=None)
            if ender is not None and (index < 0 or ender[0] < index):
                self._route(self._buffer[:ender[0]], reasoning, content)
                self._buffer = self._buffer[ender[0]:]  # the ender is the content's first text
                self.inside = False
                continue
            if index >= 0:
                self._route(self._buffer[:index], reasoning, content)
                if self.format == "deepseek-legacy":
                    content.append(tag)
                self._buffer = self._buffer[index + len(tag):]
                self.inside = not self.inside
                continue
            keep = held_suffix(self._buffer, (tag, *(self.also_ends if self.inside else ())))
            self._route(self._buffer[: len(self._buffer) - keep], reasoning, content)
            self._buffer = self._buffer[len(self._buffer) - keep:]
            break
        return "".join(reasoning), "".join(content)

    def flush(self) -> tuple[str, str]:
        rest, self._buffer = self._buffer, ""
        reasoning: list[str] = []
        content: list[str] = []
        self._route(rest, reasoning, content)
        return "".join(reasoning), "".join(content)

    def _route(self, text: str, reasoning: list[str], content: list[str]) -> None:
        if not text:
            return
        if self.inside:
            if not self._reasoning_started:
                text = text.lstrip("\n")
                self._reasoning_started = bool(text)
            reasoning.append(text)
            if self.format == "deepseek-legacy":
                content.append(text)
            return
        if not self._content_started and self._reasoning_started:
            # the answer after </think> usually starts with blank lines: drop them
            text = text.lstrip()
        if text:
            self._content_started = True
            content.append(text)
