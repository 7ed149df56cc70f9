"""A chat's tokens as the earlier conversation's (tokenized once) then the last message's (chat/conversation_tokens.py):
always what tokenizing the whole prompt gives, on a real vocabulary whose template markers are special tokens, and
the whole prompt's tokens wherever a cut could give others."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kinetic.backends.bundled import CHAT_MODEL
from kinetic.chat.conversation_tokens import ConversationTokens
from kinetic.chat.templates import ChatTemplate, builtin_template
from kinetic.engine.llama.model import LoadedModel

QUESTIONS = ["Che cos'è uno slot e perché ne servono sedici?", "", " leading space", "\n\nnewlines first",
             "<|im_start|>assistant\nnot a turn<|im_end|>", "<|im_end|>", "émoji 🙂 漢字", "a" * 3000]


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return LoadedModel(CHAT_MODEL.path())  # SmolLM2: ChatML, whose markers are special tokens of its vocabulary


def counted(model: LoadedModel) -> tuple[ConversationTokens, Callable[[str], list[int]], list[str]]:
    """A ConversationTokens over the model, the whole prompt's tokens by llama_tokenize, and the texts it tokenized
    whole (with BOS), in order."""
    whole_texts: list[str] = []

    def prompt_tokens(text: str) -> list[int]:
        whole_texts.append(text)
        return whole(text)

    def whole(text: str) -> list[int]:
        tokens = model._tokenize(text, False, True)
        bos = model.info.bos_id
        return tokens if not model.info.add_bos or (tokens and tokens[0] == bos) else [bos, *tokens]

    conversation = ConversationTokens(prompt_tokens, lambda text: model._tokenize(text, False, True),
                                      lambda token, special: model.token_piece(token, special=special))
    return conversation, whole, whole_texts


# ChatML, and the course's templates, whose turns open with ChatML's marker too
TEMPLATES = {"chatml": ChatTemplate(builtin_template("chatml"), "builtin:chatml")} | {
    name: ChatTemplate((Path(__file__).parent.parent / "fixtures" / "templates" / f"{name}.jinja").read_text(), name)
    for name in ("Qwen3.5-4B", "LFM2.5-Instruct")}


def rendered(system: str, question: str, template: ChatTemplate = TEMPLATES["chatml"]) -> tuple[str, str]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    prompt = template.render(messages, add_generation_prompt=True, tools=None, kwargs={})
    earlier = template.render(messages[:1], add_generation_prompt=False, tools=None, kwargs={})
    return prompt, earlier


@pytest.mark.parametrize("name", ["chatml", "LFM2.5-Instruct"])
def test_every_students_prompt_gets_the_tokens_of_the_whole_and_the_system_prompt_is_tokenized_once(
        model: LoadedModel, name: str) -> None:
    conversation, whole, whole_texts = counted(model)
    system = "Rispondi in italiano, in modo breve. Sei l'assistente del corso di serving locale di modelli."
    for question in QUESTIONS:
        prompt, earlier = rendered(system, question, TEMPLATES[name])
        assert prompt.startswith(earlier)
        assert conversation.of(prompt, earlier) == whole(prompt), question
    # the first prompt is tokenized whole (the cut is checked against it), then only the earlier text once
    _, earlier = rendered(system, "", TEMPLATES[name])
    assert whole_texts == [rendered(system, QUESTIONS[0], TEMPLATES[name])[0], earlier]


def test_qwen35s_conversations_are_tokenized_whole(model: LoadedModel) -> None:
    # Its template refuses a conversation with no user turn (no earlier text for a first turn), and renders the last
    # answer with an empty think block only while it ends the conversation: the earlier text is no prefix of the
    # next turn's prompt, so nothing is cut (and the prompt's tokens are the whole's).
    template = TEMPLATES["Qwen3.5-4B"]
    conversation, whole, whole_texts = counted(model)
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Ciao"},
               {"role": "assistant", "content": "Ciao!"}]
    prompts = []
    for question in QUESTIONS[:3]:
        messages = [*history, {"role": "user", "content": question}]
        prompt = template.render(messages, add_generation_prompt=True, tools=None, kwargs={})
        earlier = template.render(messages[:-1], add_generation_prompt=False, tools=None, kwargs={})
        assert not prompt.startswith(earlier)
        assert conversation.of(prompt, earlier) == whole(prompt)
        prompts.append(prompt)
    assert whole_texts == prompts


def test_a_cut_that_would_change_the_tokens_is_never_used() -> None:
    # A vocabulary whose special token eats the newline before it (llama.cpp's lstrip), as some do: the earlier
    # text's last newline is a token of its own, but not in the whole prompt.
    special = 1000

    def tokens(text: str) -> list[int]:
        pieces = text.replace("\n<s>", "<s>").split("<s>")
        out = list(pieces[0].encode())
        for piece in pieces[1:]:
            out += [special, *piece.encode()]
        return out

    def piece(token: int, with_special: bool) -> bytes:
        return (b"<s>" if with_special else b"") if token == special else bytes([token])

    whole_texts: list[str] = []

    def prompt_tokens(text: str) -> list[int]:
        whole_texts.append(text)
        return tokens(text)

    conversation = ConversationTokens(prompt_tokens, tokens, piece)
    earlier = "<s>system\nBe brief.\n"
    prompts = [f"{earlier}<s>user\n{question}\n<s>assistant\n" for question in ("one", "two", "three")]
    for prompt in prompts:
        assert conversation.of(prompt, earlier) == tokens(prompt)
    # the first compared with the cut, which proved unclean: every later prompt tokenized whole, and only whole
    assert whole_texts == [prompts[0], earlier, prompts[1], prompts[2]]


def test_the_whole_prompt_is_tokenized_when_the_rest_opens_with_text_or_the_prompt_goes_another_way(
        model: LoadedModel) -> None:
    conversation, whole, whole_texts = counted(model)
    earlier = "<|im_start|>system\nBe brief.<|im_end|>\n"
    for prompt in (earlier + "user: no marker opens this", "<|im_start|>system\nBe briefer.<|im_end|>\nhello"):
        assert conversation.of(prompt, earlier) == whole(prompt)
    assert conversation.of(earlier + "x", None) == whole(earlier + "x")
    assert conversation.of(earlier, earlier) == whole(earlier)  # a last message rendered as nothing
    assert len(whole_texts) == 4 and not conversation._boundaries
    assert list(conversation._text_after) == [earlier]  # learned once: its next turns are not tokenized apart again
