"""GET /metrics in Prometheus text: llama-server's counters and gauges under its own names, then
kinetic's lines per key name (who waits for a slot, and each key's requests, tokens and errors), and
kinetic's lines about where the model runs (kinetic:device_info, kinetic:layers_offloaded, kinetic:layers),
which llama-server's /metrics does not show.

Pure: the route passes in the engine's stats and the class's figures."""

from __future__ import annotations

from collections.abc import Mapping

from kinetic.engine.types import EngineStats, Offload

# llama-server's names, help texts and order: counters, then gauges (server-task.cpp to_metrics)
COUNTERS = (
    ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "Total time spent processing prompts"),
    ("tokens_predicted_total", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "Total time spent generating tokens"),
    ("n_decode_total", "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding"),
    ("n_tokens_max", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model"),
    ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps"),
)
GAUGES = (
    ("prompt_tokens_seconds", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "Average generation throughput in tokens/s"),
    ("requests_processing", "Number of requests processing"),
    ("requests_deferred", "Number of requests deferred"),
    ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call"),
)


# kinetic's own per-key counters (since the server started), for the instructor: the figures of the
# dashboard's table, each line labelled with the key's name (never the key)
KEY_COUNTERS = (
    ("requests", "Requests answered, by API key name"),
    ("prompt_tokens", "Prompt tokens the answers counted (cached ones included), by API key name"),
    ("completion_tokens", "Tokens generated, by API key name"),
    ("errors", "Requests answered with an error, by API key name"),
)


def _key_label(name: str) -> str:
    return name.replace("\\", "\\\\").replace('"', '\\"')


def key_counter_lines(by_key: Mapping[str, Mapping[str, int]], viewer: str | None) -> list[str]:
    """`llamacpp:<figure>_by_key_total{key="alice"} N` for every key name (a student: their own only)."""
    lines = []
    for figure, help_text in KEY_COUNTERS:
        name = f"llamacpp:{figure}_by_key_total"
        lines += [f"# HELP {name} {help_text}.", f"# TYPE {name} counter"]
        for client, figures in sorted(by_key.items()):
            if viewer is None or client == viewer:
                lines.append(f'{name}{{key="{_key_label(client)}"}} {figures.get(figure, 0)}')
    return lines


def offload_lines(offload: Offload) -> list[str]:
    """The devices the model runs on (one `kinetic:device_info` line each, valued 1) and its offloaded layers."""
    lines = ["# HELP kinetic:device_info A device the model's layers run on (the CPU when none was offloaded).",
             "# TYPE kinetic:device_info gauge"]
    lines += [f'kinetic:device_info{{name="{_key_label(d.name)}",description="{_key_label(d.description)}",'
              f'type="{d.type}"}} 1' for d in offload.devices]
    lines += ["# HELP kinetic:layers_offloaded Layers llama.cpp offloaded to a GPU (-ngl), of kinetic:layers.",
              "# TYPE kinetic:layers_offloaded gauge", f"kinetic:layers_offloaded {offload.layers_offloaded}",
              "# HELP kinetic:layers The model's layers as llama.cpp counts them (the output layer included).",
              "# TYPE kinetic:layers gauge", f"kinetic:layers {offload.layers}"]
    return lines


def metrics_text(stats: EngineStats, *, viewer: str | None = None,
                 by_key: Mapping[str, Mapping[str, int]] | None = None, offload: Offload | None = None) -> str:
    """Prometheus text: llama-server's counters and gauges under its names, then kinetic's per-key
    lines (`by_key`: the dashboard's figures per key name), which show a student (`viewer`) their own
    line only."""
    values: dict[str, float] = {**stats.counters, **stats.gauges, "requests_processing": stats.requests_processing,
                                "requests_deferred": stats.requests_deferred}
    lines = []
    for kind, items in (("counter", COUNTERS), ("gauge", GAUGES)):
        for name, help_text in items:
            lines += [f"# HELP llamacpp:{name} {help_text}", f"# TYPE llamacpp:{name} {kind}",
                      f"llamacpp:{name} {values.get(name, 0)}"]
    # kinetic's own: who is waiting (by key name), for the instructor's dashboard
    lines += ["# HELP llamacpp:requests_deferred_by_key Requests waiting for a slot, by API key name.",
              "# TYPE llamacpp:requests_deferred_by_key gauge"]
    for client, count in sorted(stats.deferred_by_client.items()):
        if viewer is not None and client != viewer:
            continue
        lines.append(f'llamacpp:requests_deferred_by_key{{key="{_key_label(client)}"}} {count}')
    if by_key is not None:
        lines += key_counter_lines(by_key, viewer)
    if offload is not None:
        lines += offload_lines(offload)
    return "\n".join(lines) + "\n"
