"""A chat's tokens as the earlier conversation's (tokenized once) then the last message's (chat/conversation_tokens.py):
always what tokenizing the whole prompt gives, on a real vocabulary whose template markers are special tokens, and
the whole prompt's tokens wherever a cut could give others."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from kinetic.backends.bundled import CHAT_MODEL
from kinetic.chat.conversation_tokens import ConversationTokens
from kinetic.chat.prepare import ChatLayer, ServerDefaults
from kinetic.chat.templates import ChatTemplate, builtin_template
from kinetic.chat.types import Message, TextPart, ToolCall
from kinetic.engine.llama.model import LoadedModel
from kinetic.engine.types import Modalities, ModelInfo

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
    # the earlier text once, and the first prompt whole (the cut is checked against it), then nothing whole
    _, earlier = rendered(system, "", TEMPLATES[name])
    assert whole_texts == [earlier, rendered(system, QUESTIONS[0], TEMPLATES[name])[0]]


class HybridVocabulary:
    """What ChatLayer asks of an engine to render and tokenize a chat, over a real vocabulary, as a hybrid model's
    (the models that look for the earlier conversation); counts the texts tokenized."""

    modalities = Modalities()
    media_marker = ""

    def __init__(self, model: LoadedModel):
        self.model = model
        self.info = replace(model.info, memory_kind="hybrid")
        self.texts: list[str] = []

    def require_ready(self) -> ModelInfo:
        return self.info

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        self.texts.append(text)
        return self.model._tokenize(text, add_special, parse_special)

    def token_piece(self, token: int, *, special: bool = False) -> bytes:
        return self.model.token_piece(token, special=special)


def chat(*turns: tuple[str, str]) -> tuple[Message, ...]:
    return tuple(Message(role=role, parts=(TextPart(text),)) for role, text in turns)


def test_qwen35s_earlier_text_is_found_in_its_rendering_of_the_whole_conversation(model: LoadedModel) -> None:
    # Its template refuses a conversation with no user turn, so a first turn's earlier text cannot be rendered
    # alone; and it writes the last answer's empty think block only while that answer ends the conversation, so a
    # later turn's earlier text rendered alone is no prefix of the prompt.
    engine = HybridVocabulary(model)
    layer = ChatLayer(engine, TEMPLATES["Qwen3.5-4B"], ServerDefaults())  # type: ignore[arg-type]
    _, whole, _ = counted(model)
    system = "Rispondi in italiano, in modo breve." * 20
    history = chat(("system", system), ("user", "Ciao"))
    thought = Message(role="assistant", parts=(TextPart("Ciao!"),), reasoning_content="Saluta.")
    called = Message(role="assistant", parts=None, tool_calls=(ToolCall("meteo", {"city": "Roma"}, "c1"),))
    first_turns = [(history[0], *chat(("user", question))) for question in QUESTIONS]
    later_turns = [(*history, thought, *chat(("user", "E poi?"))),
                   (*history, called, Message(role="tool", parts=(TextPart("18 C"),)))]
    for index, messages in enumerate(first_turns + later_turns):
        rendered = layer.render(messages, find_earlier=True)
        assert rendered.earlier == rendered.prompt[:rendered.prompt.rindex("<|im_start|>user")]
        assert rendered.tokens == whole(rendered.prompt)
        assert layer.last_message_start(messages, rendered.tokens, rendered.earlier) == len(whole(rendered.earlier))
        if index == len(first_turns) - 1:
            # The system prompt was tokenized twice, for the first question only: in the text before the last
            # message's content cut back to the turn's marker (which was looked for in the text's end alone), and in
            # the whole prompt that checks the cut; the other students' prompts, never.
            assert sum(system in text for text in engine.texts) == 2


@pytest.mark.parametrize("name", ["Qwen3.5-4B", "LFM2.5-Instruct"])
def test_a_chats_later_turns_tokenize_their_conversation_once(model: LoadedModel, name: str) -> None:
    # Every later turn ends its earlier text with a new answer; the boundary after it is the template's turn end,
    # the same at every turn, so only the first later turn checks its cut against the whole prompt.
    engine = HybridVocabulary(model)
    layer = ChatLayer(engine, TEMPLATES[name], ServerDefaults())  # type: ignore[arg-type]
    _, whole, _ = counted(model)
    messages: tuple[Message, ...] = chat(("system", "Rispondi in italiano, in modo breve. " * 10))
    for turn in range(5):
        messages = (*messages, *chat(("user", f"Domanda {turn}: che cos'è uno slot?")))
        engine.texts.clear()
        rendered = layer.render(messages, find_earlier=True)
        assert rendered.tokens == whole(rendered.prompt)
        assert rendered.earlier is not None and rendered.prompt.startswith(rendered.earlier)
        assert layer.last_message_start(messages, rendered.tokens, rendered.earlier) == len(whole(rendered.earlier))
        if turn >= 2:
            assert rendered.prompt not in engine.texts
            assert sum(len(text) for text in engine.texts) < 1.2 * len(rendered.prompt)
        messages = (*messages, *chat(("assistant", f"Uno slot tiene la cache di una richiesta. ({turn}) " * 8)))


def test_the_marker_far_from_a_long_texts_end_is_still_found(model: LoadedModel) -> None:
    conversation, _, _ = counted(model)
    head = "<|im_start|>system\nBe brief.<|im_end|>\n"
    assert conversation.before_last_special(head + "x" * 600) == "<|im_start|>system\nBe brief."
    assert conversation.before_last_special(head + "x" * 100) == "<|im_start|>system\nBe brief."
    assert conversation.before_last_special("x" * 600 + head) == "x" * 600 + "<|im_start|>system\nBe brief."
    assert conversation.before_last_special("x" * 600) is None


def test_the_earlier_text_ends_where_the_last_message_does_when_no_special_token_opens_its_turn(
        model: LoadedModel) -> None:
    # Markers that are plain text in the vocabulary, and a template that, like Qwen3.5's, renders no conversation
    # without a user turn: the checkpoint still goes where the student's question starts.
    template = ChatTemplate("{%- if messages[-1].role != 'user' %}{{ raise_exception('no user turn') }}{% endif %}"
                            "{% for m in messages %}### {{ m.role }}:\n{{ m.content }}\n\n{% endfor %}"
                            "{% if add_generation_prompt %}### assistant:\n{% endif %}", "--chat-template")
    layer = ChatLayer(HybridVocabulary(model), template, ServerDefaults())  # type: ignore[arg-type]
    _, whole, _ = counted(model)
    for question in QUESTIONS[:3]:
        messages = chat(("system", "Be brief."), ("user", question))
        rendered = layer.render(messages, find_earlier=True)
        assert rendered.earlier == "### system:\nBe brief.\n\n### user:\n"
        assert rendered.tokens == whole(rendered.prompt)
        start = layer.last_message_start(messages, rendered.tokens, rendered.earlier)
        assert 0 < start <= len(whole(rendered.earlier))
        assert rendered.tokens[:start] == whole(rendered.earlier)[:start]


# A vocabulary whose special token `<s>` eats the newline before it (llama.cpp's lstrip), as some do: an earlier
# text's last newline is a token of its own, but not in the whole prompt. Bytes are tokens.
LSTRIP_SPECIAL = 1000


def lstrip_tokens(text: str) -> list[int]:
    pieces = text.replace("\n<s>", "<s>").split("<s>")
    out = list(pieces[0].encode())
    for piece in pieces[1:]:
        out += [LSTRIP_SPECIAL, *piece.encode()]
    return out


def lstrip_piece(token: int, with_special: bool) -> bytes:
    return (b"<s>" if with_special else b"") if token == LSTRIP_SPECIAL else bytes([token])


def test_a_cut_that_would_change_the_tokens_is_never_used() -> None:
    whole_texts: list[str] = []

    def prompt_tokens(text: str) -> list[int]:
        whole_texts.append(text)
        return lstrip_tokens(text)

    conversation = ConversationTokens(prompt_tokens, lstrip_tokens, lstrip_piece)
    earlier = "<s>system\nBe brief.\n"
    prompts = [f"{earlier}<s>user\n{question}\n<s>assistant\n" for question in ("one", "two", "three")]
    for prompt in prompts:
        assert conversation.of(prompt, earlier) == lstrip_tokens(prompt)
    # the first compared with the cut, which proved unclean: every later prompt tokenized whole, and only whole
    assert whole_texts == [earlier, prompts[0], prompts[1], prompts[2]]


def test_a_turns_marker_that_strips_the_whitespace_before_it_never_gets_a_cut() -> None:
    # The earlier text found before the marker keeps its last newline, which the marker strips in the whole prompt:
    # the cut is checked against the head's own tokens, so it is never used, now or after the head's tokens have
    # been dropped from the cache and tokenized again.
    conversation = ConversationTokens(lstrip_tokens, lstrip_tokens, lstrip_piece)
    head = conversation.before_last_special("<s>system\nBe brief.\n<s>user\n")
    assert head == "<s>system\nBe brief.\n"
    for question in ("one", "two"):
        prompt = f"{head}<s>user\n{question}\n<s>assistant\n"
        assert conversation.of(prompt, head) == lstrip_tokens(prompt)
        conversation.earlier.cache_clear()


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


def test_where_no_earlier_text_is_found_the_one_rendered_alone_still_bounds_the_checkpoint(model: LoadedModel) -> None:
    # The conversation before the last message renders otherwise alone ("[end]" after its last turn), and the
    # template changes the stand-in (upper case): nothing is cut, and the checkpoint goes where the two part.
    template = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content | upper }}{% if loop.last %}[end]"
                            "{% endif %}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
                            "--chat-template")
    layer = ChatLayer(HybridVocabulary(model), template, ServerDefaults())  # type: ignore[arg-type]
    _, whole, _ = counted(model)
    messages = chat(("system", "Be brief, and answer in Italian."), ("user", "hi"))
    rendered = layer.render(messages, find_earlier=True)
    assert rendered.earlier == "<system>BE BRIEF, AND ANSWER IN ITALIAN.[end]"
    assert rendered.tokens == whole(rendered.prompt)
    start = layer.last_message_start(messages, rendered.tokens, rendered.earlier)
    assert 0 < start < len(whole(rendered.earlier)) and rendered.tokens[:start] == whole(rendered.earlier)[:start]
