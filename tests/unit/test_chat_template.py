"""ChatTemplate: SmolLM2's template by hand, Jinja features, parity with jinja2, load-time refusals."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
import pytest

from frontend.text.chat_template import (
    DEFAULT_TEMPLATE,
    ChatTemplate,
    TemplateError,
    TemplateRenderError,
)
from shared.config import BUNDLED_MODEL
from shared.tokenizer import Tokenizer
from shared.tokenizer_metadata import TokenizerMetadata, read_tokenizer_metadata
from tests.conftest import missing_bundled_model
from tests.fixtures.chat_templates import LLAMA3, METHODS, MISTRAL, QWEN, SMOLLM_TEMPLATE, ZEPHYR
from tests.fixtures.hf_chat_template import hf_render

SMOLLM_GGUF = Path.home() / ".cache/tl-serve/SmolLM2-135M-Instruct.Q4_1.gguf"
GREEDY = Path(__file__).resolve().parents[1] / "data" / "greedy.json"

HI_RENDERED = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def smollm_metadata() -> TokenizerMetadata:
    if not SMOLLM_GGUF.is_file():
        missing_bundled_model(SMOLLM_GGUF)
    return read_tokenizer_metadata(SMOLLM_GGUF)


def smollm(source: str = SMOLLM_TEMPLATE) -> ChatTemplate:
    return ChatTemplate(source, bos_token="<|im_start|>", eos_token="<|im_end|>")


def test_gguf_template_is_the_smollm_literal(smollm_metadata: TokenizerMetadata) -> None:
    # the GGUF's string literals hold real newlines where the literal writes \n escapes
    assert smollm_metadata.chat_template is not None
    assert smollm_metadata.chat_template.replace("\n", "\\n") == SMOLLM_TEMPLATE


def test_hand_example() -> None:
    assert (
        smollm().render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
        == HI_RENDERED
    )


def test_hand_example_with_gguf_template(smollm_metadata: TokenizerMetadata) -> None:
    assert smollm_metadata.chat_template is not None
    template = ChatTemplate(
        smollm_metadata.chat_template, smollm_metadata.bos_token, smollm_metadata.eos_token
    )
    assert (
        template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
        == HI_RENDERED
    )


def test_system_message_replaces_the_default_turn() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    expected = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    assert smollm().render(messages, add_generation_prompt=False) == expected
    assert (
        smollm().render(messages, add_generation_prompt=True)
        == expected + "<|im_start|>assistant\n"
    )


def greedy_chat_records() -> list[dict[str, object]]:
    if not GREEDY.is_file():
        return []
    records: list[dict[str, object]] = json.loads(GREEDY.read_text())["records"]
    return [r for r in records if r["kind"] == "chat"]


def test_greedy_reference_has_chat_records() -> None:
    assert len(greedy_chat_records()) >= 1


@pytest.mark.parametrize("record", greedy_chat_records(), ids=lambda r: str(r["prompt"])[:40])
def test_greedy_reference_prompts(
    smollm_metadata: TokenizerMetadata, record: dict[str, object]
) -> None:
    assert smollm_metadata.chat_template is not None
    template = ChatTemplate(
        smollm_metadata.chat_template, smollm_metadata.bos_token, smollm_metadata.eos_token
    )
    rendered = template.render(record["prompt"], add_generation_prompt=True)  # type: ignore[arg-type]
    assert rendered == record["rendered"]
    assert Tokenizer(smollm_metadata).encode(rendered) == record["prompt_ids"]


def test_default_template() -> None:
    template = ChatTemplate(DEFAULT_TEMPLATE, bos_token="", eos_token="")
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]
    assert (
        template.render(messages, add_generation_prompt=True)
        == "<|system|>\nS\n<|user|>\nHi\n<|assistant|>\n"
    )
    assert template.render(messages, add_generation_prompt=False) == "<|system|>\nS\n<|user|>\nHi\n"


CONVERSATION: list[dict[str, object]] = [
    {"role": "system", "content": "  Sys  "},
    {"role": "user", "content": "/help me"},
    {"role": "assistant", "content": "Sure."},
    {"role": "user", "content": "Ünïcode <b>&</b> {{ not_a_tag }}"},
]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ messages[0].content|trim|upper }}|{{ messages|length }}", "SYS|4"),
        ("{{ messages|map(attribute='role')|join(',') }}", "system,user,assistant,user"),
        ("{{ messages[9] is defined }}|{{ missing|default('d') }}", "False|d"),
        (
            "{% for m in messages %}{% if m.role == 'system' %}S{% elif m.role == 'user' %}U"
            "{% else %}A{% endif %}{% if not loop.last %}-{% endif %}{% endfor %}",
            "S-U-A-U",
        ),
        (
            "{% for m in messages %}{{ loop.index }}{% if loop.last %}!{% endif %}{% endfor %}",
            "1234!",
        ),
        # whitespace control and trim_blocks / lstrip_blocks
        ("a\n  {%- if true -%}\n  b  \n{%- endif -%}\n  c", "abc"),
        ("{% if true %}\n  x\n  {% endif %}\ny", "  x\ny"),
        ("line\n", "line"),  # no trailing newline kept
        # python string methods
        ("{{ messages[0].content.strip() }}|{{ messages[1].content.startswith('/') }}", "Sys|True"),
        ("{{ messages[1].content.split(' ')|join('_') }}|{{ 'ab'.upper() }}", "/help_me|AB"),
        # tojson: non-ASCII kept, HTML characters not escaped, keyword arguments
        ("{{ messages[3].content|tojson }}", '"Ünïcode <b>&</b> {{ not_a_tag }}"'),
        (
            "{{ {'k': [1, none, true]}|tojson(indent=2) }}",
            '{\n  "k": [\n    1,\n    null,\n    true\n  ]\n}',
        ),
        ("{{ bos_token }}{{ eos_token }}", "<s></s>"),
        (
            "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
            "4",
        ),
        ("{{ tools is none }}", "True"),
    ],
)
def test_features(source: str, expected: str) -> None:
    template = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    assert template.render(CONVERSATION, add_generation_prompt=False) == expected


def test_strftime_now_and_tools() -> None:
    template = ChatTemplate("{{ strftime_now('%Y') }}|{{ tools|tojson }}", "", "")
    year = datetime.now().strftime("%Y")
    assert (
        template.render([], add_generation_prompt=True, tools=[{"name": "f"}])
        == f'{year}|[{{"name": "f"}}]'
    )


def test_raise_exception_is_a_render_error_with_the_message() -> None:
    # the sample conversation at load starts with a system turn: refused by the template, which
    # is a judgement on that conversation, so the template still loads
    template = ChatTemplate(MISTRAL, "<s>", "</s>")
    assert template.render([{"role": "user", "content": "a"}], True) == "<s>[INST] a [/INST]"
    with pytest.raises(TemplateRenderError) as info:
        template.render([{"role": "assistant", "content": "a"}], True)
    assert (
        info.value.message == "Conversation roles must alternate user/assistant/user/assistant/..."
    )


def test_runtime_type_error_is_a_render_error() -> None:
    with pytest.raises(TemplateRenderError, match="invalid operation"):
        smollm().render([{"role": "user", "content": 3}], add_generation_prompt=True)


def test_fuel_stops_a_runaway_render() -> None:
    source = (
        "{% if messages|length > 5 %}{% for i in range(10000) %}{% for j in range(10000) %}"
        "{{ '' }}{% endfor %}{% endfor %}{% endif %}ok"
    )
    template = ChatTemplate(source, "", "")
    assert template.render([], add_generation_prompt=True) == "ok"
    with pytest.raises(TemplateRenderError, match="fuel"):
        template.render([{"role": "user", "content": "x"}] * 6, add_generation_prompt=True)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{% for m in messages %}{{ m.content }}", "does not compile"),
        ("{% if add_generation_prompt %}x", "does not compile"),
        ("{{ messages[0].content ", "does not compile"),
        ("{% frobnicate %}", "unknown statement"),
        ("{{ messages|frobnicate }}", "unknown filter: frobnicate"),
        # in a branch that the sample conversation never takes
        ("{% if tools %}{{ tools|to_json }}{% endif %}", "unknown filter: to_json"),
        ("{%- filter shout -%}x{%- endfilter -%}", "unknown filter: shout"),
        ("{% if tools and tools is iterable_thing %}x{% endif %}", "unknown test: iterable_thing"),
        ("{% if tools is not frobbed %}x{% endif %}", "unknown test: frobbed"),
        ("{{ frobnicate(messages) }}", "frobnicate is unknown"),
        ("{{ messages[0].content.frobnicate() }}", "no method named frobnicate"),
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "fuel",
        ),
    ],
)
def test_broken_templates_are_refused_at_load(source: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        ChatTemplate(source, "", "")


@pytest.mark.parametrize(
    "source",
    [
        "{{ '|frobnicate is nothing' }}{# {{ x|frobnicate }} #}",
        "{% raw %}{{ x|frobnicate }}{% endraw %}",
        "{{ \"it's | frobnicate\" }}{{ 'a \\' | b' }}",
    ],
)
def test_filter_names_in_strings_comments_and_raw_are_not_checked(source: str) -> None:
    ChatTemplate(source, "", "")


PARITY_CONVERSATIONS: list[list[dict[str, object]]] = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
    CONVERSATION,
    [
        {"role": "user", "content": "  lead\n\ntrail  \n"},
        {"role": "assistant", "content": "\nok\n"},
    ],
]
METEO = {"name": "météo", "parameters": {"b": 1, "a": [True, None]}}
PARITY_TOOLS: list[list[dict[str, object]] | None] = [
    None,
    [{"type": "function", "function": METEO}],
]


@pytest.mark.parametrize(
    "source", [SMOLLM_TEMPLATE, DEFAULT_TEMPLATE, ZEPHYR, LLAMA3, QWEN, METHODS]
)
@pytest.mark.parametrize("messages", PARITY_CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("tools", PARITY_TOOLS)
def test_parity_with_jinja2(
    source: str,
    messages: list[dict[str, object]],
    add_generation_prompt: bool,
    tools: list[dict[str, object]] | None,
) -> None:
    expected = hf_render(
        source, messages=messages, add_generation_prompt=add_generation_prompt, tools=tools,
        bos_token="<s>", eos_token="</s>",
    )  # fmt: skip
    template = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    assert template.render(messages, add_generation_prompt, tools=tools) == expected


@pytest.mark.parametrize(
    "messages",
    [[{"role": "system", "content": "x"}], [{"role": "assistant", "content": "x"}]],
)
def test_parity_of_raise_exception_with_jinja2(messages: list[dict[str, object]]) -> None:
    with pytest.raises(jinja2.exceptions.TemplateError) as expected:
        hf_render(MISTRAL, messages, True, bos_token="<s>", eos_token="</s>")
    with pytest.raises(TemplateRenderError) as got:
        ChatTemplate(MISTRAL, "<s>", "</s>").render(messages, add_generation_prompt=True)
    assert got.value.message == str(expected.value)


SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def smollm_templates() -> list[str]:
    """SmolLM2's template as a literal, and the bundled GGUF's own when it is here."""
    templates = [SMOLLM_TEMPLATE]
    bundled = Path(BUNDLED_MODEL).expanduser()
    if bundled.exists():
        bundled_template = read_tokenizer_metadata(bundled).chat_template
        assert bundled_template is not None
        templates.append(bundled_template)
    return templates


def test_chat_template_hand_example() -> None:
    for source in smollm_templates():
        t = ChatTemplate(source, "<|im_start|>", "<|im_end|>")
        hi = [{"role": "user", "content": "Hi"}]
        # loop.first and messages[0] is not system: the default system turn, then the user's,
        # then the generation prompt
        assert t.render(hi, add_generation_prompt=True) == (
            SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        )
        assert (
            t.render(hi, add_generation_prompt=False) == SYSTEM + "<|im_start|>user\nHi<|im_end|>\n"
        )
        turns = [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Bye"},
        ]
        assert t.render(turns, add_generation_prompt=True) == (
            SYSTEM
            + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
            + "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
        )  # the system turn once, at the top only
        own = [{"role": "system", "content": "Be terse."}, *hi]
        assert t.render(own, add_generation_prompt=True) == (
            "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n"
        )
    # filters, elif, loop.last, whitespace control
    mix = ChatTemplate(
        "{%- for m in messages -%}\n  {%- if m.role == 'user' -%} U"
        "{%- elif m.role == 'assistant' -%} A{%- else -%} S{%- endif -%}"
        ":{{ m.content | trim | upper }}{% if not loop.last %}|{% endif %}\n"
        "{%- endfor %}{{ bos_token }}{{ eos_token }}",
        "<s>",
        "</s>",
    )
    three = [
        {"role": "system", "content": " x "},
        {"role": "user", "content": "hi "},
        {"role": "assistant", "content": "yo"},
    ]
    assert mix.render(three, add_generation_prompt=False) == "S:X|U:HI|A:YO<s></s>"
    # the default template, for models without one
    default = ChatTemplate(DEFAULT_TEMPLATE, "", "")
    assert default.render(three, add_generation_prompt=True) == (
        "<|system|>\n x \n<|user|>\nhi \n<|assistant|>\nyo\n<|assistant|>\n"
    )
