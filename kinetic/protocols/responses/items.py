"""A turn's input items: `input` read as items, the records the store keeps of them (GET .../input_items), and
a stored conversation read back as input (previous_response_id)."""

from __future__ import annotations

from typing import Any

from kinetic.errors import field_error
from kinetic.protocols.common import translate as common
from kinetic.protocols.responses.types import INPUT_ITEMS, InputItemModel, MessageItem, ResponsesRequest


def input_items(req: ResponsesRequest) -> list[InputItemModel]:
    """`input` as items: a string is one user message."""
    if isinstance(req.input, str):
        return [MessageItem(role="user", content=req.input)]
    if not req.input:
        raise field_error("input", "must be a string or a non-empty list of items")
    return list(req.input)


def input_item_records(req: ResponsesRequest) -> list[dict[str, Any]]:
    """This turn's input as the store keeps it (GET .../input_items)."""
    return item_records(input_items(req))


def item_records(items: list[InputItemModel]) -> list[dict[str, Any]]:
    """Items as the stores keep them: each as sent, with an id, and a message's text as a content part (as
    OpenAI lists it)."""
    records = []
    for item in items:
        record = item.model_dump(by_alias=True, exclude_none=True)
        if isinstance(item, MessageItem) and isinstance(item.content, str):
            kind = "output_text" if item.role == "assistant" else "input_text"
            record["content"] = [{"type": kind, "text": item.content}]
        if "id" not in record:
            prefix = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_"}.get(item.type, "rs_")
            record = {"id": common.random_id(prefix, 32), **record}
        records.append(record)
    return records


def history_items(records: list[dict[str, Any]]) -> list[InputItemModel]:
    """A stored conversation's items (inputs, and outputs as a next turn sends them back) read as input."""
    return INPUT_ITEMS.validate_python(records)


def conversation_id(req: ResponsesRequest) -> str | None:
    """`conversation`: its id, or `{"id": ...}`; with `previous_response_id` too, a 400 (OpenAI takes one)."""
    if req.conversation is None:
        return None
    if req.previous_response_id is not None:
        raise field_error("conversation", "cannot be sent with 'previous_response_id': continue one or the other")
    found = req.conversation.get("id") if isinstance(req.conversation, dict) else req.conversation
    if not isinstance(found, str) or not found:
        raise field_error("conversation", "must be a conversation's id, or an object with its 'id'")
    return found
