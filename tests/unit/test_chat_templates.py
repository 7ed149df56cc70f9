import pytest

from kinetic.chat.templates import BUILTIN_NAMES, builtin_template, choose_template
from kinetic.errors import InvalidRequestError

GEMMA = dict(gguf_template=None, architecture="gemma3", bos_token="<bos>", eos_token="<eos>")


def test_gemma_architecture_without_template_gets_gemma_turns() -> None:
    template = choose_template(**GEMMA)
    assert template.origin == "builtin:gemma"
    prompt = template.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert prompt == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_gemma_multi_turn_and_no_generation_prompt() -> None:
    template = choose_template(**GEMMA)
    prompt = template.render([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                              {"role": "user", "content": "c"}], add_generation_prompt=False)
    assert prompt == ("<bos><start_of_turn>user\na<end_of_turn>\n<start_of_turn>model\nb<end_of_turn>\n"
                      "<start_of_turn>user\nc<end_of_turn>\n")


def test_gemma_lists_tools_and_renders_tool_round_trip() -> None:
    template = choose_template(**GEMMA)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    prompt = template.render([
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "tool_calls": [{"id": "1", "type": "function",
                                              "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "tool_call_id": "1", "content": "sunny"},
    ], tools=tools)
    assert '"name": "get_weather"' in prompt
    assert '{"name": "get_weather", "arguments": {"city": "Rome"}}' in prompt
    assert "sunny" in prompt and prompt.endswith("<start_of_turn>model\n")


def test_other_architectures_fall_back_to_chatml() -> None:
    template = choose_template(gguf_template=None, architecture="llama", bos_token="<s>", eos_token="</s>")
    assert template.origin == "builtin:chatml"
    assert (template.render([{"role": "user", "content": "Hi"}])
            == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_gguf_template_wins_and_sees_kwargs() -> None:
    source = "{% for m in messages %}{{ m.content }}{% endfor %}{% if enable_thinking is false %}/no_think{% endif %}"
    template = choose_template(**{**GEMMA, "gguf_template": source})
    assert template.origin == "gguf"
    assert template.render([{"role": "user", "content": "x"}], kwargs={"enable_thinking": False}) == "x/no_think"


def test_override_by_name_by_text_and_by_file(tmp_path) -> None:
    assert choose_template(**GEMMA, override="chatml").origin == "builtin:chatml"
    assert choose_template(**GEMMA, override="{{ messages[0].content }}").origin == "--chat-template"
    path = tmp_path / "t.jinja"
    path.write_text("{{ bos_token }}{{ messages[0].content }}")
    template = choose_template(**GEMMA, override_file=str(path))
    assert template.render([{"role": "user", "content": "q"}]) == "<bos>q"


def test_unknown_template_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown chat template"):
        choose_template(**GEMMA, override="nonsense")


def test_raise_exception_becomes_400() -> None:
    template = choose_template(**{**GEMMA, "gguf_template": "{{ raise_exception('roles must alternate') }}"})
    with pytest.raises(InvalidRequestError, match="roles must alternate"):
        template.render([{"role": "user", "content": "x"}])


def test_tojson_keeps_unicode() -> None:
    template = choose_template(**{**GEMMA, "gguf_template": "{{ messages[0] | tojson }}"})
    assert "città" in template.render([{"role": "user", "content": "città"}])


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_builtin_templates_render(name: str) -> None:
    template = choose_template(**GEMMA, override=name)
    assert "Hi" in template.render([{"role": "user", "content": "Hi"}])
    assert builtin_template(name)
