"""Which call format a chat template speaks, told from the markers its source writes (llama-server's
common_chat_try_specialized_template tests, then the generic families' markers)."""

from __future__ import annotations

JSON = "json"  # kinetic's own shape, compiled and streamed by kinetic.chat.toolcalls


def detect_call_format(source: str) -> str:
    """The call format a chat template's source speaks (common_chat_try_specialized_template's tests,
    then the markers the generic families write); `json` when it names none."""
    if "<|channel|>" in source:
        return "gpt-oss"
    if "<|tool_list_start|>" in source or "List of tools: [" in source:
        return "lfm2"
    if "<tool_call>" in source and "<function=" in source and "<parameter=" in source:
        return "qwen-xml"
    if "tool▁calls▁begin" in source:
        return "deepseek-r1" if "```json" in source else "deepseek-v3"
    if "<|START_ACTION|>" in source:
        return "command-r7b"
    if "Write \\'Action:\\'" in source or ("Action:" in source and "directly-answer" in source):
        return "command-r-plus"
    if "[TOOL_CALLS]" in source:
        return "mistral-args" if "[ARGS]" in source else "mistral"
    if "<tool_call>" in source and "<arg_key>" not in source and "<invoke name=" not in source:
        return "hermes"  # (GLM's and MiniMax's <tool_call> hold tagged arguments, not Hermes JSON)
    if "<|python_tag|>" in source or ("<|start_header_id|>" in source and '"parameters"' in source):
        return "llama3"
    return JSON
