"""TokenizerMetadata from GGUF metadata and from Hugging Face directories: ids, end-of-generation set, errors."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest

from shared.tokenizer import Tokenizer
from shared.tokenizer_metadata import CONTROL, NORMAL, USER_DEFINED, read_tokenizer_metadata
from tests.fixtures.byte_tokenizer import byte_tokenizer_json, byte_unicode_chars

SMOLLM_GGUF = Path.home() / ".cache/tl-serve/SmolLM2-135M-Instruct.Q4_1.gguf"
needs_smollm = pytest.mark.skipif(not SMOLLM_GGUF.is_file(), reason=f"{SMOLLM_GGUF} is absent")

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<tool>"]
# the same texts as ordinary (non-control) tokens: must not join the end-of-generation set
PLAIN = ["<|end|>"]


def write_gguf(path: Path, model: str = "gpt2", **ids: int) -> Path:
    """A metadata-only GGUF: byte tokens, then SPECIALS as CONTROL, then PLAIN as NORMAL."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre("default")
    w.add_token_list(byte_unicode_chars() + SPECIALS + PLAIN)
    w.add_token_types([NORMAL] * 256 + [CONTROL] * len(SPECIALS) + [NORMAL] * len(PLAIN))
    w.add_token_merges(["Ġ t", "Ġt h"])
    for key, value in ids.items():
        w.add_uint32(f"tokenizer.ggml.{key}", value)
    w.add_chat_template("{{ messages[0]['content'] }}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@needs_smollm
def test_smollm_gguf_metadata() -> None:
    metadata = read_tokenizer_metadata(SMOLLM_GGUF)
    assert len(metadata.tokens) == len(metadata.token_types) == 49152
    assert metadata.tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert metadata.token_types[:17] == [CONTROL] * 17
    assert metadata.token_types[17] == NORMAL
    assert len(metadata.merges) == 48900
    assert metadata.merges[0] == "Ġ t"
    assert metadata.pre_tokenizer == "smollm"
    assert metadata.bos_id == 1
    assert metadata.bos_token == "<|im_start|>"
    assert metadata.eos_token == "<|im_end|>"
    # metadata eos (2) plus <|endoftext|> (0), the same stop set as the reference run
    assert metadata.eos_ids == [0, 2]
    assert metadata.add_bos is False
    assert metadata.add_eos is False
    assert (metadata.model, metadata.byte_level, metadata.add_space_prefix) == ("gpt2", True, False)
    assert (metadata.eos_id, metadata.scores, metadata.rstrip_ids) == (2, [], [])
    assert metadata.tokenizer_json is None
    assert metadata.chat_template is not None
    assert metadata.chat_template.startswith("{% for message in messages %}")


def test_gguf_end_of_generation_set(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", bos_token_id=256, eos_token_id=256, eom_token_id=260)
    metadata = read_tokenizer_metadata(path)
    # eos says <|im_start|> (256); <|im_end|> 257, <|endoftext|> 258, <|eot_id|> 259 are control
    # end-of-turn texts; eom names 260 (<tool>); the NORMAL "<|end|>" (261) is not special
    assert metadata.eos_ids == [256, 257, 258, 259, 260]
    assert metadata.bos_token == metadata.eos_token == "<|im_start|>"
    assert metadata.merges == ["Ġ t", "Ġt h"]
    assert metadata.pre_tokenizer == "default"
    assert metadata.chat_template == "{{ messages[0]['content'] }}"
    assert metadata.tokens[97] == "a"
    assert metadata.tokens[32] == "Ġ"


def test_gguf_without_eos_metadata_takes_the_first_end_of_turn_token(tmp_path: Path) -> None:
    metadata = read_tokenizer_metadata(write_gguf(tmp_path / "m.gguf"))
    assert metadata.bos_id is None
    assert metadata.bos_token == ""
    assert metadata.eos_ids == [257, 258, 259]
    assert metadata.eos_token == "<|im_end|>"


@pytest.mark.parametrize(
    ("model", "ids", "message"),
    [
        ("bert", {}, "tokenizer.ggml.model = 'bert' is not served"),
        ("gpt2", {"eos_token_id": 5000}, "eos_token_id = 5000 is outside the vocabulary"),
    ],
)
def test_gguf_refusals_name_the_file(
    tmp_path: Path, model: str, ids: dict[str, int], message: str
) -> None:
    path = write_gguf(tmp_path / "bad.gguf", model=model, **ids)
    with pytest.raises(ValueError, match=message) as info:
        read_tokenizer_metadata(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("tokenizer.ggml.tokens", "abc", "Expected `array`, got `str`"),
        ("tokenizer.ggml.token_type", ["1"] * 3, r"Expected `int`, got `str` - at `\$\[0\]`"),
        ("tokenizer.ggml.merges", [1, 2], "Expected `str`, got `int`"),
        ("tokenizer.ggml.bos_token_id", "1", "Expected `int`, got `str`"),
        ("tokenizer.ggml.add_bos_token", 1, "Expected `bool`, got `int`"),
        ("tokenizer.chat_template", 7, "Expected `str`, got `int`"),
    ],
)
def test_gguf_metadata_of_the_wrong_type_is_refused_by_its_key(
    tmp_path: Path, key: str, value: object, message: str
) -> None:
    # a single string for the tokens was a vocabulary of its characters
    values: dict[str, object] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": ["a", "b", "c"],
        key: value,
    }
    w = gguf.GGUFWriter(str(tmp_path / "typed.gguf"), "llama")
    for k, v in values.items():
        if isinstance(v, list):
            w.add_array(k, v)  # of the first item's type
        elif isinstance(v, str):
            w.add_string(k, v)
        else:
            assert isinstance(v, int)
            w.add_int32(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=f"{key} has the wrong type: {message}") as info:
        read_tokenizer_metadata(tmp_path / "typed.gguf")
    assert "typed.gguf" in str(info.value)


def test_gguf_missing_tokens_and_garbage_file(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(str(tmp_path / "empty.gguf"), "llama")
    w.add_tokenizer_model("gpt2")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(
        ValueError, match=r"empty\.gguf: GGUF metadata has no tokenizer\.ggml\.tokens"
    ):
        read_tokenizer_metadata(tmp_path / "empty.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match=r"junk\.gguf"):
        read_tokenizer_metadata(tmp_path / "junk.gguf")
    with pytest.raises(ValueError, match=r"not a \.gguf file or a model directory"):
        read_tokenizer_metadata(tmp_path / "nothing.bin")


def write_hf_dir(root: Path, files: dict[str, object]) -> Path:
    root.mkdir()
    (root / "tokenizer.json").write_text(byte_tokenizer_json(SPECIALS))
    for name, doc in files.items():
        (root / name).write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return root


def test_hf_dir_metadata(tmp_path: Path) -> None:
    root = write_hf_dir(
        tmp_path / "m",
        {
            "tokenizer_config.json": {
                "chat_template": "tokenizer {{ messages }}",
                "bos_token": {"content": "<|im_start|>", "special": True, "__type": "AddedToken"},
                "eos_token": "<|im_end|>",
                "add_bos_token": True,
                "added_tokens_decoder": {"260": {"content": "<tool>", "special": False}},
            },
            "generation_config.json": {"eos_token_id": [259, 97], "chat_template": "generation"},
            "config.json": {"eos_token_id": 98, "bos_token_id": None, "hidden_size": 8},
        },
    )
    metadata = read_tokenizer_metadata(root)
    assert metadata.tokenizer_json == (root / "tokenizer.json").read_text()
    assert len(metadata.tokens) == 256 + len(SPECIALS)
    assert metadata.tokens[97] == "a"
    assert metadata.tokens[256:] == SPECIALS
    assert metadata.token_types[:256] == [NORMAL] * 256
    # the config marks <tool> as not special: user-defined, outside the end-of-generation set
    assert metadata.token_types[256:] == [CONTROL] * 4 + [USER_DEFINED]
    assert metadata.bos_id == 256
    assert metadata.bos_token == "<|im_start|>"
    assert metadata.eos_token == "<|im_end|>"
    # generation_config (259, 97) + config (98) + tokenizer_config's eos (257) + <|endoftext|>
    assert metadata.eos_ids == [97, 98, 257, 258, 259]
    assert metadata.chat_template == "generation"  # generation_config wins over tokenizer_config
    assert metadata.add_bos is True
    assert metadata.pre_tokenizer == "hf"
    assert metadata.merges == []


def test_hf_dir_minimal_and_template_fallbacks(tmp_path: Path) -> None:
    bare = read_tokenizer_metadata(write_hf_dir(tmp_path / "bare", {}))
    assert bare.chat_template is None
    assert bare.bos_id is None
    assert bare.bos_token == ""
    assert bare.eos_ids == [257, 258, 259]
    assert bare.eos_token == ""
    assert bare.add_bos is False

    named = {
        "chat_template": [
            {"name": "tool_use", "template": "t"},
            {"name": "default", "template": "d"},
        ]
    }
    with_tools = read_tokenizer_metadata(
        write_hf_dir(tmp_path / "named", {"tokenizer_config.json": named})
    )
    assert (with_tools.chat_template, with_tools.tool_use_template) == ("d", "t")
    assert bare.tool_use_template is None
    jinja = read_tokenizer_metadata(
        write_hf_dir(tmp_path / "jinja", {"chat_template.jinja": "from file"})
    )
    assert jinja.chat_template == "from file"


def test_hf_dir_add_bos_from_post_processor(tmp_path: Path) -> None:
    doc = json.loads(byte_tokenizer_json(SPECIALS))
    doc["post_processor"] = {
        "type": "Sequence",
        "processors": [
            {
                "type": "ByteLevel",
                "add_prefix_space": False,
                "trim_offsets": True,
                "use_regex": True,
            },
            {
                "type": "TemplateProcessing",
                "single": [
                    {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                ],
                "pair": [],
                "special_tokens": {},
            },
        ],
    }
    root = write_hf_dir(tmp_path / "m", {"tokenizer_config.json": {"bos_token": "<|im_start|>"}})
    (root / "tokenizer.json").write_text(json.dumps(doc))
    metadata = read_tokenizer_metadata(root)
    assert (metadata.add_bos, metadata.add_eos) == (True, False)
    assert metadata.byte_level is True  # its decoder is ByteLevel
    # the same template with EOS after the sequence: add_eos
    single = doc["post_processor"]["processors"][1]["single"]
    single.append({"SpecialToken": {"id": "<|im_end|>", "type_id": 0}})
    config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    root = write_hf_dir(tmp_path / "eos", {"tokenizer_config.json": config})
    (root / "tokenizer.json").write_text(json.dumps(doc))
    metadata = read_tokenizer_metadata(root)
    assert (metadata.add_bos, metadata.add_eos) == (True, True)
    tok = Tokenizer(metadata)
    assert tok.encode("a", add_special_tokens=True) == [256, 97, 257]
    assert tok.encode("a") == [97]


def test_hf_dir_sentencepiece_pieces_are_not_byte_level(tmp_path: Path) -> None:
    doc = json.loads(byte_tokenizer_json(SPECIALS))
    doc["decoder"] = {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]}
    root = write_hf_dir(tmp_path / "m", {"tokenizer_config.json": {"add_eos_token": True}})
    (root / "tokenizer.json").write_text(json.dumps(doc))
    assert read_tokenizer_metadata(root).byte_level is False
    assert read_tokenizer_metadata(root).add_eos is True


@pytest.mark.parametrize(
    ("files", "where", "message"),
    [
        ({"tokenizer_config.json": "{not json"}, "tokenizer_config.json", "JSON"),
        (
            {"generation_config.json": {"eos_token_id": "x"}},
            "generation_config.json",
            "eos_token_id",
        ),
        ({"config.json": {"eos_token_id": 9999}}, "config.json", "outside the vocabulary"),
        ({"tokenizer_config.json": {"eos_token": "<nope>"}}, "tokenizer_config.json", "<nope>"),
        (
            {"tokenizer_config.json": {"added_tokens_decoder": {"256": {"content": "<x>"}}}},
            "tokenizer_config.json",
            "not in tokenizer.json",
        ),
    ],
)
def test_hf_dir_refusals_name_the_file(
    tmp_path: Path, files: dict[str, object], where: str, message: str
) -> None:
    root = write_hf_dir(tmp_path / "m", files)
    with pytest.raises(ValueError, match=message) as info:
        read_tokenizer_metadata(root)
    assert str(root / where) in str(info.value)


def test_hf_dir_without_tokenizer_json(tmp_path: Path) -> None:
    root = write_hf_dir(tmp_path / "m", {})
    (root / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=r"tokenizer\.json: missing"):
        read_tokenizer_metadata(root)
    (root / "tokenizer.json").write_text('{"model": {"vocab": {"a": "zero"}}}')
    with pytest.raises(ValueError, match=r"tokenizer\.json: .*vocab"):
        read_tokenizer_metadata(root)
