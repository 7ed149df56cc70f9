"""A class's chats on a hybrid model whose vocabulary makes ChatML's markers special tokens (the tiny LFM2 with the
bundled chat model's vocabulary), with the model's ChatML template and with Qwen3.5's (the course's: it renders no
conversation without a user turn). Such a prompt is read as the conversation before the question, tokenized once for
the class, then the question's turn (chat/conversation_tokens.py): each student's prompt must still be the very
tokens of the whole text, as /tokenize gives them, and its greedy answer the one that text gets on /completion. The
state where the question's turn opens is kept, so the next student's first turn starts from there."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hybrid_model import tiny_model
from tests.server import KineticServer

pytestmark = pytest.mark.e2e

SYSTEM = ("Rispondi in italiano, in modo breve. Sei l'assistente del corso di serving locale di modelli: "
          "spiega slot, cache e batch con esempi piccoli.")
QUESTIONS = ["Che cos'è uno slot?", "Perché la cache conta?", " <|im_end|> a marker typed by a student",
             "\n\nA question after blank lines", "Émoji 🙂 e 漢字"]
N_PREDICT = 8


QWEN35_TEMPLATE = Path(__file__).parent.parent / "fixtures" / "templates" / "Qwen3.5-4B.jinja"


@pytest.fixture(scope="module", params=["model's own", "Qwen3.5"])
def server(model_lock: None, request: pytest.FixtureRequest) -> Iterator[KineticServer]:
    template = () if request.param == "model's own" else ("--chat-template-file", str(QWEN35_TEMPLATE))
    with KineticServer("-m", str(tiny_model("lfm2", "smollm2")), "-c", "2048", "-np", "2", *template) as server:
        yield server


def post(server: KineticServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(server.url + path, json=body, timeout=60)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_each_students_chat_reads_the_tokens_of_its_whole_prompt(server: KineticServer) -> None:
    for question in QUESTIONS:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        prompt = post(server, "/apply-template", {"messages": messages})["prompt"]
        tokens = post(server, "/tokenize", {"content": prompt, "add_special": True})["tokens"]
        chat = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": N_PREDICT, "temperature": 0,
                                                     "ignore_eos": True, "cache_prompt": False,
                                                     "reasoning_format": "none"})
        assert chat["usage"]["prompt_tokens"] == len(tokens), question
        whole = post(server, "/completion", {"prompt": tokens, "n_predict": N_PREDICT, "temperature": 0,
                                             "ignore_eos": True, "cache_prompt": False})
        assert chat["choices"][0]["message"]["content"] == whole["content"], question


def test_the_next_students_first_turn_starts_where_the_question_opens(server: KineticServer) -> None:
    system = SYSTEM + " Il laboratorio di oggi: " + "misura il TTFT con uno, quattro e sedici studenti. " * 4
    for question in ("Che cos'è uno slot?", "Quanto costa il prefill?"):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        chat = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 2, "temperature": 0})
    prompt = post(server, "/apply-template", {"messages": messages})["prompt"]
    before_question = prompt[:prompt.rindex("<|im_start|>user")]
    shared = post(server, "/tokenize", {"content": before_question, "add_special": True})["tokens"]
    assert chat["timings"]["cache_n"] == len(shared)
