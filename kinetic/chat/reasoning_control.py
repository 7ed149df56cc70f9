"""The server's reasoning switches as llama-server applies them to a chat request (common/arg.cpp, chat.cpp,
server-common.cpp): the reasoning budget, --reasoning-preserve and --skip-chat-parsing.

- Budget: `reasoning_budget_tokens` (or `thinking_budget_tokens`, or Anthropic's `thinking.budget_tokens`) of
  the request, else --reasoning-budget; -1 is no limit. It applies to templates that think in <think> tags,
  and the engine forces `--reasoning-budget-message` and `</think>` once it is spent
  (kinetic.engine.llama.reasoning_budget). Constrained output gets none: its think block is closed before
  generation (prepare.close_reasoning).
- Control: `reasoning_control: true` arms the budget even with no limit, so that POST
  /v1/chat/completions/control (`reasoning_end`) can force the end of the thinking while it runs.
- Preserve: the template variables llama.cpp sets from `preserve_reasoning` (jinja caps_apply_preserve_reasoning);
  a template that reads one of them keeps, or drops, the reasoning of earlier turns.
- Skip chat parsing: everything generated is content; tools still reach the prompt, but no call is read out
  of the answer and no grammar holds it (llama-server's pure content parser).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kinetic.chat.constraints import ChatConstraints, output_grammar
from kinetic.chat.reasoning import CLOSE_TAG, OPEN_TAG
from kinetic.chat.types import ChatRequest
from kinetic.engine.types import ReasoningBudget

UNLIMITED = 2**31 - 1  # llama-server's INT_MAX budget: counted, never spent


def preserve_variables(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` with the variables `preserve_reasoning` stands for (the template's own kwargs win)."""
    preserve = kwargs.get("preserve_reasoning")
    if not isinstance(preserve, bool):
        return kwargs
    implied = {"preserve_thinking": preserve, "clear_thinking": not preserve,
               "truncate_history_thinking": not preserve, "drop_thinking": not preserve}
    return {**implied, **kwargs}


def reasoning_budget(req: ChatRequest, *, server_tokens: int, server_message: str, thinks: bool,
                     starts_inside: bool, constrained: bool) -> ReasoningBudget | None:
    """The budget a chat request gets, or None for unlimited thinking (or none to limit). A request with
    `reasoning_control` gets one even without a limit (llama-server's budget sampler of INT_MAX tokens), so
    that /v1/chat/completions/control can end its thinking."""
    tokens = req.reasoning_budget if req.reasoning_budget is not None and req.reasoning_budget != -1 \
        else server_tokens
    if tokens < 0 and req.reasoning_control:
        tokens = UNLIMITED
    if tokens < 0 or not thinks or constrained:
        return None
    message = req.reasoning_budget_message if req.reasoning_budget_message is not None else server_message
    return ReasoningBudget(tokens=tokens, start=OPEN_TAG, end=CLOSE_TAG, message=message,
                           starts_inside=starts_inside, controllable=req.reasoning_control)


def pure_content(constraints: ChatConstraints, req: ChatRequest) -> ChatConstraints:
    """--skip-chat-parsing: the tools stay in the prompt, but only the request's own output constraint holds
    the answer and nothing is read out of it as a call."""
    return replace(constraints, grammar=output_grammar(req.output), tool_mode="none", tool_names=())
