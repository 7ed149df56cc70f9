"""llama-server's flags act on what a request gets (issue 23): sampling flags become every protocol's
defaults (a request's own field wins), and model and context flags change what llama.cpp loads.

Two servers of the bundled model: `constrained` with sampling defaults, a JSON schema, a stop string,
a q8_0 KV cache and -ngl 99; `special` with --special, --ignore-eos, a logit bias, -kvu, --no-mmap and a
metadata override. Both save a slot, so their KV caches' sizes can be compared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import pytest
from openai import OpenAI

from tests.lora_model import write_lora
from tests.server import KineticServer, wait_until

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
START_OF_TURN = 105  # Gemma's <start_of_turn>, a special (control) token
BOS = 2
PROMPT = "The weather in Rome today is sunny and the people walk along the river"


@pytest.fixture(scope="module")
def constrained(model_lock: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KineticServer]:
    slots = tmp_path_factory.mktemp("slots-q8")
    with KineticServer("-a", "flagged", "-c", "1024", "-np", "1", "-n", "48", "--temp", "0", "--top-k", "1",
                       "--seed", "3", "--top-p", "0.5", "--min-p", "0.1", "--repeat-penalty", "1.1",
                       "--samplers", "top_k;temperature",
                       "--json-schema", json.dumps(SCHEMA), "-r", r"\x7d", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0",
                       "-ngl", "99", "-tb", "1", "--slot-save-path", str(slots), "--metrics") as server:
        yield server


@pytest.fixture(scope="module")
def special(model_lock: None, constrained: KineticServer,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[KineticServer]:
    slots = tmp_path_factory.mktemp("slots-f16")
    with KineticServer("-c", "1024", "-np", "2", "-kvu", "-n", "3", "--temp", "0", "--special", "--ignore-eos",
                       "-l", f"{START_OF_TURN}+100", "--no-mmap",
                       "--override-kv", "tokenizer.ggml.add_bos_token=bool:false", "--ui-config", '{"theme": "dark"}',
                       "-ot", r"blk\.0\.attn_q\.weight=CPU", "--cpu-moe", "-ncffn", "1", "-dev", "none",
                       "--slot-save-path", str(slots)) as server:
        yield server


def completion(server: KineticServer, **body: object) -> dict:
    response = httpx.post(server.url + "/completion", json={"prompt": PROMPT, **body}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_props_shows_the_sampling_flags(constrained: KineticServer) -> None:
    props = httpx.get(constrained.url + "/props").json()
    params = props["default_generation_settings"]["params"]
    assert (params["temperature"], params["top_k"], params["seed"], params["top_p"], params["min_p"]) == \
        (0.0, 1, 3, 0.5, 0.1)
    assert params["repeat_penalty"] == pytest.approx(1.1) and params["samplers"] == ["top_k", "temperature"]
    assert params["n_predict"] == 48
    llama = props["llama_params"]
    assert (llama["flash_attn"], llama["cache_type_k"], llama["cache_type_v"], llama["n_gpu_layers"]) == \
        ("on", "q8_0", "q8_0", 99)
    assert llama["threads_batch"] == 1


def test_a_request_without_fields_is_held_to_the_servers_schema_and_stop(constrained: KineticServer) -> None:
    result = completion(constrained)
    settings = result["generation_settings"]
    assert settings["stop"] == ["}"] and "root ::=" in settings["grammar"]  # -r '\x7d', escapes processed
    assert result["stop_type"] == "word" and result["stopping_word"] == "}"
    assert json.loads(result["content"] + "}").keys() == {"ok"}  # the schema's object, cut at the stop


def test_a_requests_own_fields_win(constrained: KineticServer) -> None:
    own_stop = completion(constrained, stop=["zzz"])
    assert own_stop["generation_settings"]["stop"] == ["zzz"]
    assert isinstance(json.loads(own_stop["content"])["ok"], bool)
    own_grammar = completion(constrained, grammar='root ::= "yes" | "no"', temperature=0.5, top_k=5)
    assert own_grammar["content"] in ("yes", "no")
    assert (own_grammar["generation_settings"]["temperature"], own_grammar["generation_settings"]["top_k"]) == (0.5, 5)
    own_schema = completion(constrained, json_schema={"type": "array", "items": {"type": "integer"}, "maxItems": 2},
                            stop=["zzz"])
    assert isinstance(json.loads(own_schema["content"]), list)


def test_every_protocol_gets_the_servers_defaults(constrained: KineticServer) -> None:
    openai = OpenAI(base_url=constrained.url + "/v1", api_key="none", max_retries=0, timeout=120)
    chat = openai.chat.completions.create(model="flagged", messages=[{"role": "user", "content": "Is it sunny?"}],
                                          stop=["zzz"])
    assert isinstance(json.loads(chat.choices[0].message.content or "")["ok"], bool)
    cut = openai.completions.create(model="flagged", prompt=PROMPT)  # no stop: the server's "}" ends it
    assert cut.choices[0].finish_reason == "stop" and json.loads(cut.choices[0].text + "}").keys() == {"ok"}
    response = openai.responses.create(model="flagged", input="Is it sunny?")
    assert json.loads(response.output_text + "}").keys() == {"ok"}  # Responses has no stop field of its own
    message = anthropic.Anthropic(base_url=constrained.url, api_key="none", max_retries=0).messages.create(
        model="flagged", max_tokens=48, messages=[{"role": "user", "content": "Is it sunny?"}], stop_sequences=["zzz"])
    assert isinstance(json.loads(message.content[0].text)["ok"], bool)  # type: ignore[union-attr]
    generated = ollama.Client(host=constrained.url).generate(model="flagged", prompt=PROMPT, options={"stop": ["zzz"]})
    assert isinstance(json.loads(generated.response)["ok"], bool)


def test_special_tokens_ignore_eos_and_logit_bias_act(special: KineticServer) -> None:
    params = httpx.get(special.url + "/props").json()["default_generation_settings"]["params"]
    assert params["ignore_eos"] is True
    forced = completion(special, return_tokens=True)
    assert forced["tokens"] == [START_OF_TURN] * 3 and forced["content"] == "<start_of_turn>" * 3  # --special
    bias = forced["generation_settings"]["logit_bias"]
    assert bias[0] == {"bias": 100.0, "token": START_OF_TURN}
    # --ignore-eos: every end-of-generation token at -inf, shown as null, as llama-server shows it
    assert bias[1:] and all(entry["bias"] is None for entry in bias[1:])
    # the request's own (empty) bias replaces the server's
    own = completion(special, logit_bias=[], ignore_eos=False, return_tokens=True)
    assert own["generation_settings"]["logit_bias"] == [] and own["tokens"] != [START_OF_TURN] * 3


def test_kv_unified_gives_each_slot_the_whole_context(special: KineticServer) -> None:
    props = httpx.get(special.url + "/props").json()
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 1024  # not 1024 / 2
    assert props["ui_settings"] == {"theme": "dark"}  # --ui-config


def test_tensor_placement_flags_reach_llama_cpp_and_props(special: KineticServer) -> None:
    """-ot, --cpu-moe, -ncffn and -dev none: llama.cpp loaded the model with them (it answers) and /props shows
    them; on this CPU build every tensor sits in host memory either way (the params: tests/unit/test_llama_params)."""
    llama = httpx.get(special.url + "/props").json()["llama_params"]
    assert llama["devices"] == []
    assert llama["tensor_overrides"] == [r"blk\.0\.attn_q\.weight=CPU", r"\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU",
                                         r"blk\.0\.ffn_(up|down|gate)\.=CPU"]
    assert completion(special)["tokens_predicted"] == 3


def test_the_offload_is_logged_at_start_and_shown_in_props_and_metrics(constrained: KineticServer,
                                                                      special: KineticServer) -> None:
    """-ngl 99: the start says what llama-server says about the offload ("offloaded N/M layers to GPU"), and /props
    and /metrics show the devices. On a build without a GPU backend (CI's) that is the CPU, in one line."""
    shown = httpx.get(constrained.url + "/props").json()["offload"]
    metrics = httpx.get(constrained.url + "/metrics").text
    assert shown["layers"] == 19  # Gemma 3 270M's 18 layers and its output layer
    if shown["backends"] == ["CPU"]:
        assert shown["layers_offloaded"] == 0 and shown["cpu_reason"] == "this llama.cpp build has no GPU backend"
        assert [d["type"] for d in shown["devices"]] == ["CPU"] and shown["devices"][0]["memory_total"] > 0
        assert "offloaded 0/19 layers to GPU: this llama.cpp build has no GPU backend (backends: CPU); the model " \
               "runs on the CPU" in constrained.log()
    else:
        assert shown["layers_offloaded"] == 19 and all(d["type"] != "CPU" for d in shown["devices"])
        assert "offloaded 19/19 layers to GPU" in constrained.log()
    device = shown["devices"][0]
    assert f'kinetic:device_info{{name="{device["name"]}",description="{device["description"]}",' \
           f'type="{device["type"]}"}} 1' in metrics.splitlines()
    assert f"kinetic:layers_offloaded {shown['layers_offloaded']}" in metrics.splitlines()
    assert "kinetic:layers 19" in metrics.splitlines()
    # -dev none: nothing offloaded, whatever the build, and the start says why
    assert httpx.get(special.url + "/props").json()["offload"]["cpu_reason"] == "-dev none"
    assert "offloaded 0/19 layers to GPU: -dev none" in special.log()


def test_override_kv_changes_the_models_metadata(constrained: KineticServer, special: KineticServer) -> None:
    def tokens(server: KineticServer) -> list[int]:
        body = {"content": "hello", "add_special": True}
        return httpx.post(server.url + "/tokenize", json=body, timeout=30).json()["tokens"]

    assert tokens(constrained)[0] == BOS and BOS not in tokens(special)  # add_bos_token=bool:false
    assert completion(special)["tokens_evaluated"] == completion(constrained)["tokens_evaluated"] - 1


def test_no_mmap_reads_the_model_into_memory(constrained: KineticServer, special: KineticServer) -> None:
    def mapped(server: KineticServer) -> bool:
        assert server.proc is not None
        maps = Path(f"/proc/{server.proc.pid}/maps").read_text()
        return ".gguf" in maps

    assert mapped(constrained) and not mapped(special)


def test_a_q8_0_kv_cache_takes_about_half_the_memory(constrained: KineticServer, special: KineticServer) -> None:
    def bytes_per_token(server: KineticServer) -> float:
        completion(server, n_predict=1, cache_prompt=True, id_slot=0)
        saved = httpx.post(server.url + "/slots/0?action=save", json={"filename": "s.bin"}, timeout=60).json()
        return saved["n_written"] / saved["n_saved"]

    q8, f16 = bytes_per_token(constrained), bytes_per_token(special)
    assert 0.45 < q8 / f16 < 0.65  # q8_0 stores 34 bytes per 32 values, f16 64


# --- server flags: --api-prefix, --ssl-*, --embd-normalize, --reasoning-effort ---------------------------

TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}effort={{ reasoning_effort }}\n"


@pytest.fixture(scope="module")
def https(model_lock: None, special: KineticServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """HTTPS under /llama, with a self-signed certificate made by openssl; yields the base URL."""
    folder = tmp_path_factory.mktemp("tls")
    key, cert, template = folder / "key.pem", folder / "cert.pem", folder / "t.jinja"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    template.write_text(TEMPLATE)
    (folder / "static").mkdir()
    (folder / "static" / "index.html").write_text("<h1>a class's own page</h1>")
    server = KineticServer("-c", "512", "-np", "1", "--api-prefix", "/llama", "--ssl-key-file", str(key),
                           "--ssl-cert-file", str(cert), "--embeddings", "--embd-normalize", "1",
                           "--reasoning-effort", "high", "--chat-template-file", str(template), "--no-cache-prompt",
                           "--threads-http", "2", "--path", str(folder / "static"))
    command = [sys.executable, "-m", "kinetic", "serve", "--host", "127.0.0.1", "--port", str(server.port),
               *server.args]
    log = server.log_path.open("w")
    server.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=server.env)
    base = f"https://127.0.0.1:{server.port}/llama"
    try:
        wait_until(lambda: "listening on https://127.0.0.1:" in server.log() or not server.alive(), "https start")
        assert server.alive(), server.log()
        yield base
    finally:
        server.stop()


def test_https_under_an_api_prefix(https: str) -> None:
    assert httpx.get(https + "/health", verify=False).status_code == 200
    outside = httpx.get(https.removesuffix("/llama") + "/health", verify=False)
    assert outside.status_code == 404 and outside.json()["error"]["type"] == "not_found_error"
    with pytest.raises(httpx.HTTPError):
        httpx.get(https.replace("https://", "http://") + "/health", timeout=5)  # no plain HTTP on that port
    openai = OpenAI(base_url=https + "/v1", api_key="none", max_retries=0, http_client=httpx.Client(verify=False))
    assert openai.completions.create(model="any", prompt="Hello", max_tokens=2).usage.completion_tokens == 2
    assert httpx.get(https + "/", verify=False).text == "<h1>a class's own page</h1>"  # --path, under the prefix


def test_embd_normalize_sets_the_native_default(https: str) -> None:
    def vector(**body: object) -> list[float]:
        answer = httpx.post(https + "/embedding", json={"content": "hello world", **body}, verify=False, timeout=60)
        return answer.json()[0]["embedding"][0]

    assert sum(abs(v) for v in vector()) == pytest.approx(1.0, abs=1e-4)  # 1: taxicab
    assert sum(v * v for v in vector(embd_normalize=2)) == pytest.approx(1.0, abs=1e-4)  # the request's own wins


def test_reasoning_effort_reaches_the_template(https: str) -> None:
    def prompt(**body: object) -> str:
        answer = httpx.post(https + "/apply-template", json={"messages": [{"role": "user", "content": "hi"}], **body},
                            verify=False, timeout=30)
        return answer.json()["prompt"]

    assert prompt().endswith("effort=high")
    assert prompt(chat_template_kwargs={"reasoning_effort": "low"}).endswith("effort=low")


def test_no_cache_prompt_is_the_default_a_request_can_override(https: str) -> None:
    def cached(**body: object) -> int:
        request = {"prompt": PROMPT, "n_predict": 1, **body}
        answer = httpx.post(https + "/completion", json=request, verify=False, timeout=60)
        return answer.json()["timings"]["cache_n"]

    cached(), cached()
    assert cached() == 0  # --no-cache-prompt: the prefix is evaluated again
    cached(cache_prompt=True)
    assert cached(cache_prompt=True) > 0  # the request's own field wins


# --- LoRA: --lora and /lora-adapters ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def lora(model_lock: None, https: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KineticServer]:
    adapter = write_lora(tmp_path_factory.mktemp("lora") / "lora.gguf")
    # two slots of 512 tokens (the https server's one slot): per-request scales run side by side
    with KineticServer("-c", "1024", "-np", "2", "--lora", str(adapter)) as server:
        yield server


def greedy(url: str, **client: object) -> str:
    body = {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "cache_prompt": False}
    answer = httpx.post(url + "/completion", json=body, timeout=120, **client)  # type: ignore[arg-type]
    assert answer.status_code == 200, answer.text
    return answer.json()["content"]


def test_a_lora_adapter_changes_greedy_output_and_scale_0_restores_it(lora: KineticServer, https: str) -> None:
    (listed,) = httpx.get(lora.url + "/lora-adapters").json()
    assert listed["id"] == 0 and listed["path"].endswith("lora.gguf") and listed["scale"] == 1.0
    base = greedy(https, verify=False)  # the same model and context size, no adapter
    adapted = greedy(lora.url)
    assert adapted != base
    assert httpx.post(lora.url + "/lora-adapters", json=[{"id": 0, "scale": 0}]).json() == {"success": True}
    assert httpx.get(lora.url + "/lora-adapters").json()[0]["scale"] == 0.0
    assert greedy(lora.url) == base
    httpx.post(lora.url + "/lora-adapters", json=[{"id": 0, "scale": 1}])
    assert greedy(lora.url) == adapted
    assert httpx.post(lora.url + "/lora-adapters", json={"id": 0}).status_code == 400


def adapted_at(url: str, scale: float | None, path: str = "/completion") -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": PROMPT, "n_predict": 24, "temperature": 0, "cache_prompt": False}
    if path == "/v1/chat/completions":
        # fresh like the others: the alone request reused the concurrent one's cached head, and on an AVX-512 EPYC
        # its answer then parted from the fresh one's at a near tie (2026-12-04), which is not what this test is about
        body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24, "temperature": 0,
                "cache_prompt": False}
    if scale is not None:
        body["lora"] = [{"id": 0, "scale": scale}]
    answer = httpx.post(url + path, json=body, timeout=120, verify=False)  # the https server's certificate is its own
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_requests_own_lora_applies_to_it_alone_while_another_runs(lora: KineticServer, https: str) -> None:
    """llama-server's per-request `lora`: scale 0 gives the base model's text and scale 1 the adapter's, both in
    flight at once on two slots (their steps take turns: one context holds one set of scales at a time), on
    /completion, /v1/completions and /v1/chat/completions; /lora-adapters keeps the server's scale."""
    base = adapted_at(https, None)
    with ThreadPoolExecutor(2) as pool:
        off, on = pool.map(lambda scale: adapted_at(lora.url, scale), [0.0, 1.0])
    assert off["content"] == base["content"] and on["content"] == adapted_at(lora.url, None)["content"]
    assert on["content"] != base["content"] and {off["id_slot"], on["id_slot"]} == {0, 1}
    assert off["generation_settings"]["lora"] == [{"id": 0, "scale": 0.0}]
    assert httpx.get(lora.url + "/lora-adapters").json()[0]["scale"] == 1.0
    client = OpenAI(base_url=lora.url + "/v1", api_key="none")
    legacy = client.completions.create(model="any", prompt=PROMPT, max_tokens=24, temperature=0,
                                       extra_body={"lora": [{"id": 0, "scale": 0}], "cache_prompt": False})
    assert legacy.choices[0].text == base["content"]
    with ThreadPoolExecutor(2) as pool:
        chat_off, chat_on = pool.map(lambda scale: adapted_at(lora.url, scale, "/v1/chat/completions"), [0.0, 1.0])
    text = [answer["choices"][0]["message"]["content"] for answer in (chat_off, chat_on)]
    assert text[0] != text[1]
    assert text[1] == adapted_at(lora.url, None, "/v1/chat/completions")["choices"][0]["message"]["content"]
    bad = httpx.post(lora.url + "/completion", json={"prompt": PROMPT, "lora": {"id": 0}})
    assert bad.status_code == 400 and "lora" in bad.json()["error"]["message"]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="thread affinity is read from Linux's /proc")
def test_cpu_mask_pins_llama_cpps_threads(model_lock: None) -> None:
    """-C 0x3 --cpu-strict 1: llama.cpp's two compute threads run one on CPU 0 and one on CPU 1 (its thread pool
    is made with the mask), while the server's other threads keep every CPU; /props shows the pools' settings.
    (Two threads pinned to one CPU would show it too, but their spinning barriers take 15 s for four tokens.)"""
    with KineticServer("-np", "1", "-c", "512", "-t", "2", "-C", "0x3", "--cpu-strict", "1", "--poll", "0",
                       "--prio-batch", "0") as server:
        assert completion(server, n_predict=4)["tokens_predicted"] == 4
        assert server.proc is not None
        tasks = Path(f"/proc/{server.proc.pid}/task").iterdir()
        allowed = [line.split(":")[1].strip() for task in tasks for line in (task / "status").read_text().splitlines()
                   if line.startswith("Cpus_allowed_list")]
        assert allowed.count("0") == allowed.count("1") == 1  # one pool thread on each CPU
        assert len(set(allowed)) == 3  # and the rest on every CPU
        cpu = httpx.get(server.url + "/props").json()["llama_params"]["cpu"]
        assert cpu == {"cpus": [0, 1], "strict": True, "priority": "normal", "poll": 0}


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="thread affinity is read from Linux's /proc")
def test_threads_that_fill_the_cpus_get_one_each_by_default(model_lock: None) -> None:
    """No -C, -t or --cpu-strict: llama.cpp's threads, one per CPU this process may use, are pinned one to each (as
    `-C <all> --cpu-strict 1`); `--cpu-strict 0` leaves them to the kernel, as llama-server does."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one CPU: nothing to place")
    for flags, pinned in (((), True), (("--cpu-strict", "0"), False)):
        with KineticServer("-np", "1", "-c", "512", *flags) as server:
            assert completion(server, n_predict=4)["tokens_predicted"] == 4
            assert server.proc is not None
            tasks = Path(f"/proc/{server.proc.pid}/task").iterdir()
            allowed = [line.split(":")[1].strip() for task in tasks
                       for line in (task / "status").read_text().splitlines() if line.startswith("Cpus_allowed_list")]
            assert all(allowed.count(str(cpu)) == (1 if pinned else 0) for cpu in cpus), allowed
            cpu = httpx.get(server.url + "/props").json()["llama_params"]["cpu"]
            assert cpu["cpus"] == (cpus if pinned else []) and cpu["strict"] is pinned


def test_slot_prompt_similarity_chooses_between_the_cached_slot_and_the_least_recently_used(
        model_lock: None) -> None:
    """-sps: a prompt goes to the idle slot holding its longest cached prefix only when that prefix is more than
    the threshold's share of the prompt; else to the least recently used idle slot (llama-server's choice)."""
    shared = "The weather in Rome today is sunny and the people walk along the river."
    first = shared + " In the evening they eat in the small restaurants of Trastevere and talk about football."
    second = shared + " A completely different story follows here about mountains, snow and winter sports."
    for threshold, same_slot in (("0.1", True), ("0.9", False)):
        with KineticServer("-np", "2", "-c", "1024", "-n", "2", "--temp", "0", "-sps", threshold) as server:
            one = completion(server, prompt=first)
            two = completion(server, prompt=second)
            share = two["timings"]["cache_n"] / two["tokens_evaluated"] if same_slot else None
            assert (one["id_slot"] == two["id_slot"]) is same_slot, (threshold, one["id_slot"], two["id_slot"])
            assert share is None or 0.1 < share < 0.9  # the prompts really share a part between the thresholds


def test_cache_idle_slots_saves_a_slots_prompt_before_a_new_one_takes_it(model_lock: None) -> None:
    """--cache-idle-slots (the default): one slot, prompt A, then B, then A again: A comes back from the
    --cache-ram cache; with --no-cache-idle-slots A's cells went with B and A is evaluated again."""
    first = "The weather in Rome today is sunny and the people walk along the river, talking about the news."
    other = "Mountains, snow and winter sports fill the second story, which shares nothing with the first one."
    for flag, restored in (("--cache-idle-slots", True), ("--no-cache-idle-slots", False)):
        with KineticServer("-np", "1", "-c", "1024", "-n", "2", "--temp", "0", "--cache-ram", "64", flag) as server:
            completion(server, prompt=first)
            completion(server, prompt=other)
            again = completion(server, prompt=first)
            cached, prompt = again["timings"]["cache_n"], again["tokens_evaluated"]
            assert (cached == prompt - 1) is restored, (flag, cached, prompt)  # all but the re-evaluated last
