"""llama-server's views of the server's state, outward: GET /props, /slots and /metrics, the slot-file
and LoRA answers. Pure: the routes read the backend's state and hand it in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kinetic.engine.types import (
    GenerationRequest,
    Modalities,
    ModelInfo,
    Offload,
    SamplingParams,
    SlotFileResult,
    SlotState,
)
from kinetic.errors import InvalidRequestError
from kinetic.protocols.common import translate as common
from kinetic.protocols.common.native import generation_settings


def router_props(*, max_instances: int, autoload: bool, build_info: str) -> dict[str, Any]:
    """GET /props of a router asked for no model in particular (llama-server's router answer)."""
    return {"role": "router", "max_instances": max_instances, "models_autoload": autoload,
            "model_alias": "kinetic", "model_path": "none",
            "default_generation_settings": {"params": {}, "n_ctx": 0}, "build_info": build_info,
            "cors_proxy_enabled": False}


@dataclass(frozen=True)
class ServedState:
    """What GET /props shows of a model, handed in by the route (its backend's description and switches)."""

    alias: str
    info: ModelInfo
    n_ctx: int
    n_slots: int
    sampling: SamplingParams
    n_predict: int
    n_keep: int
    template_source: str
    template_origin: str
    build_info: str
    endpoint_slots: bool
    endpoint_props: bool
    endpoint_metrics: bool
    ui_settings: dict[str, Any]
    llama_params: dict[str, Any]
    is_sleeping: bool = False  # --sleep-idle-seconds
    speculative_types: tuple[str, ...] = ()
    modalities: Modalities = field(default_factory=Modalities)  # what the model's projector reads
    media_marker: str = ""


def props(state: ServedState) -> dict[str, Any]:
    info = state.info
    defaults = generation_settings(GenerationRequest(prompt_tokens=[], sampling=state.sampling,
                                                     max_tokens=state.n_predict, n_keep=state.n_keep), short=True,
                                   speculative=state.speculative_types)
    return {
        "default_generation_settings": {"n_ctx": state.n_ctx, "params": defaults},
        "total_slots": state.n_slots,
        "model_alias": state.alias,
        "model_ftype": info.ftype,
        "model_path": str(info.path),
        # kinetic's: which cache paths apply (docs/models.md); llama-server has no such field
        "memory_kind": info.memory_kind,
        "modalities": {"vision": state.modalities.vision, "video": False, "audio": state.modalities.audio},
        **({"media_marker": state.media_marker} if state.media_marker else {}),
        "endpoint_slots": state.endpoint_slots,
        "endpoint_props": state.endpoint_props,
        "endpoint_metrics": state.endpoint_metrics,
        "chat_template": state.template_source,
        "chat_template_origin": state.template_origin,
        "chat_template_caps": {"supports_tools": True, "supports_parallel_tool_calls": False},
        "bos_token": info.bos_token,
        "eos_token": info.eos_token,
        "build_info": state.build_info,
        "is_sleeping": state.is_sleeping,
        "ui_settings": state.ui_settings,
        # kinetic's addition: what the model and context flags (-ngl, -fa, -ctk...) asked of llama.cpp
        "llama_params": state.llama_params,
        # kinetic's addition: where llama.cpp put the model (llama-server only logs it)
        **({"offload": offload_props(info.offload)} if info.offload is not None else {}),
    }


def offload_props(offload: Offload) -> dict[str, Any]:
    """/props's `offload`: the backends, the devices the layers run on, and how many layers were offloaded."""
    return {"backends": list(offload.backends),
            "devices": [{"name": d.name, "description": d.description, "type": d.type,
                         "memory_total": d.memory_total, "memory_free": d.memory_free} for d in offload.devices],
            "layers_offloaded": offload.layers_offloaded, "layers": offload.layers, "cpu_reason": offload.cpu_reason}


def lora_scales(body: Any) -> dict[int, float]:
    """POST /lora-adapters: `[{"id": 0, "scale": 0.5}, ...]` (llama-server's parse_lora_request)."""
    if not isinstance(body, list):
        raise InvalidRequestError("Request body must be an array", param="body")
    return common.lora_entries(body, param="body")


def slots(states: list[SlotState], n_ctx: int, *, viewer: str | None = None,
          speculative: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """GET /slots: a slot that has run a task also shows it (`id_task`, its `params`, the counts).
    A student (`viewer`, their name) sees whose request and its settings only on their own slots:
    of the others' only that they are busy and the counts (the admin, `viewer` None, sees all)."""
    result = []
    for slot in states:
        entry: dict[str, Any] = {"id": slot.id, "n_ctx": n_ctx, "speculative": bool(speculative),
                                 "is_processing": slot.is_processing}
        own = viewer is None or (slot.is_processing and slot.client == viewer)
        if slot.is_processing and own:
            entry["key"] = slot.client  # whose request it is: a key's name, never the key
        if slot.used:
            entry.update(id_task=slot.id_task, n_prompt_tokens=slot.n_prompt_tokens,
                         n_prompt_tokens_processed=slot.n_prompt_tokens_processed,
                         n_prompt_tokens_cache=slot.n_prompt_tokens_cache)
            if slot.request is not None and own:
                entry["params"] = generation_settings(slot.request, short=True, speculative=speculative)
            entry["next_token"] = [{"has_next_token": slot.is_processing, "has_new_line": False, "n_remain": -1,
                                    "n_decoded": slot.n_decoded}]
        result.append(entry)
    return result


def slot_file(action: str, result: SlotFileResult, filename: str | None) -> dict[str, Any]:
    """POST /slots/{id}?action=...: llama-server's answer for each action."""
    if action == "save":
        return {"id_slot": result.id_slot, "filename": filename, "n_saved": result.n_tokens,
                "n_written": result.n_bytes, "timings": {"save_ms": result.ms}}
    if action == "restore":
        return {"id_slot": result.id_slot, "filename": filename, "n_restored": result.n_tokens,
                "n_read": result.n_bytes, "timings": {"restore_ms": result.ms}}
    return {"id_slot": result.id_slot, "n_erased": result.n_tokens}


def slot_filename(raw: str | None) -> str:
    """A bare file name inside --slot-save-path (llama.cpp's fs_validate_filename, in short)."""
    if (not raw or len(raw.encode("utf-8")) > 255 or raw in (".", "..") or raw.startswith(".")
            or any(c in raw for c in '/\\:*?"<>|') or any(ord(c) < 32 for c in raw)):
        raise InvalidRequestError("Invalid filename", param="filename")
    return raw

