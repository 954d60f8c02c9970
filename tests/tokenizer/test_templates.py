"""Chat templates render exactly what transformers' apply_chat_template renders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from aserve.errors import InvalidRequestError
from aserve.tokenizer import ChatTemplate, Tokenizer, apply_chat_template, tokenizer_from_gguf, tokenizer_from_hf_dir
from aserve.tokenizer.gguf_proto import proto_from_gguf, read_gguf_metadata
from aserve.tokenizer.spm import SentencePieceTokenizer
from tests.tokenizer.bpe import FAMILIES, save_gguf, save_hf_dir, train

# The chat template Gemma 3's instruction-tuned checkpoints ship (their tokenizer_config.json),
# kept as data: the bundled base GGUF carries none, and its built-in format must equal it.
GEMMA3_TEMPLATE = (Path(__file__).parents[1] / "fixtures" / "gemma3_chat_template.jinja").read_text()

CONVERSATION = [
    {"role": "system", "content": "You are terse. Réponds en français si besoin."},
    {"role": "user", "content": "  Hi! 🦙  "},
    {"role": "assistant", "content": "Hello.\n"},
    {"role": "user", "content": "What is 2+2?"},
]

# Loop controls, tojson of non-ASCII (no escaping, no HTML escaping), raise_exception,
# namespace, dict, tools and documents: what Hugging Face templates lean on.
TOOL_TEMPLATE = """{{ bos_token }}
{%- set ns = namespace(seen=0) -%}
{%- if tools %}
<tools>{% for tool in tools %}{{ tool | tojson }}{% if not loop.last %}, {% endif %}{% endfor %}</tools>
{% endif %}
{%- if documents %}{% for d in documents %}[doc {{ loop.index }}: {{ d.title }}] {{ d.text }}
{% endfor %}{% endif %}
{%- for m in messages %}
    {%- if m.role == 'system' %}{% continue %}{% endif %}
    {%- if m.content == 'STOP' %}{% break %}{% endif %}
    {%- if m.role == 'wizard' %}{{ raise_exception('no wizards: ' ~ m.content) }}{% endif %}
    {%- set ns.seen = ns.seen + 1 %}
<|im_start|>{{ m.role }}
{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls | tojson(indent=2) }}{% endif %}<|im_end|>
{% endfor %}
{%- set extra = dict(n=ns.seen) %}
{%- if add_generation_prompt %}<|im_start|>assistant ({{ extra.n }} turns)
{% endif %}"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "météo",
            "description": "Wetter für eine Stadt — 天気",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Zürich", "東京"]}}},
        },
    }
]
DOCUMENTS = [{"title": "Über", "text": "<b>bold</b> & ünïcode"}]


@pytest.fixture(scope="module")
def gemma(default_gguf: Path) -> Tokenizer:
    return tokenizer_from_gguf(default_gguf)


@pytest.fixture(scope="module")
def hf_gemma(default_gguf: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(default_gguf.parent), gguf_file=default_gguf.name)
    tok.chat_template = GEMMA3_TEMPLATE
    return tok


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("turns", [2, 4])
def test_default_model_template_matches_transformers(
    gemma: Tokenizer, hf_gemma: Any, default_gguf: Path, add_generation_prompt: bool, turns: int
) -> None:
    msgs = CONVERSATION[:turns]
    want = hf_gemma.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt)
    # The bundled GGUF has no template: the built-in Gemma format is used, and must equal it.
    assert gemma.chat_template is None
    assert apply_chat_template(gemma, msgs, add_generation_prompt) == want
    # The same template given to our Jinja environment renders the same text too.
    proto, _ = proto_from_gguf(read_gguf_metadata(default_gguf))
    templated = SentencePieceTokenizer(
        proto,
        bos_token_id=gemma.bos_token_id,
        eos_token_ids=gemma.eos_token_ids,
        chat_template=ChatTemplate(GEMMA3_TEMPLATE, "test"),
    )
    assert apply_chat_template(templated, msgs, add_generation_prompt) == want
    ids = gemma.encode(want)
    assert ids == hf_gemma(want, add_special_tokens=False).input_ids


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    family = FAMILIES["qwen2"]
    root = save_hf_dir(train(family), family, tmp_path_factory.mktemp("tpl"))
    (root / "chat_template.jinja").write_text(TOOL_TEMPLATE)
    return root


def test_tool_template_matches_transformers(qwen_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(qwen_dir))
    tok = tokenizer_from_hf_dir(qwen_dir)
    assert tok.chat_template_source == "chat_template.jinja"
    msgs = [
        {"role": "system", "content": "skipped by continue"},
        {"role": "user", "content": "Wie ist das Wetter in Zürich? 🌦"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "météo", "arguments": {"city": "Zürich"}}]},
        {"role": "tool", "content": "22°C, ☀"},
        {"role": "user", "content": "STOP"},
        {"role": "user", "content": "never rendered"},
    ]
    for kwargs in ({"tools": TOOLS, "documents": DOCUMENTS}, {}):
        for gen in (True, False):
            want = ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, **kwargs)
            got = apply_chat_template(tok, msgs, gen, **kwargs)
            assert got == want
    with_tools = apply_chat_template(tok, msgs, tools=TOOLS)
    assert '"météo"' in with_tools and "\\u" not in with_tools  # tojson keeps non-ASCII


def test_raise_exception_is_a_request_error(qwen_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(qwen_dir))
    msgs = [{"role": "user", "content": "hi"}, {"role": "wizard", "content": "abracadabra"}]
    with pytest.raises(Exception, match="no wizards: abracadabra"):
        ref.apply_chat_template(msgs, tokenize=False)
    tok = tokenizer_from_hf_dir(qwen_dir)
    # Our validation refuses unknown roles before the template sees them; a template's own
    # raise_exception reaches the client as a 400 with its message.
    with pytest.raises(InvalidRequestError, match="role"):
        apply_chat_template(tok, msgs)
    strict = "{% if messages|length > 1 %}{{ raise_exception('one message only, got ' ~ messages|length) }}{% endif %}"
    (qwen_dir / "chat_template.jinja").write_text(strict)
    try:
        with pytest.raises(InvalidRequestError, match="one message only, got 2"):
            apply_chat_template(tokenizer_from_hf_dir(qwen_dir), msgs[:1] * 2)
    finally:
        (qwen_dir / "chat_template.jinja").write_text(TOOL_TEMPLATE)


def test_sandbox_and_globals(qwen_dir: Path) -> None:
    def render(template: str) -> str:
        d = qwen_dir.parent / "sandbox"
        d.mkdir(exist_ok=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            (d / f).write_bytes((qwen_dir / f).read_bytes())
        (d / "chat_template.jinja").write_text(template)
        return apply_chat_template(tokenizer_from_hf_dir(d), [{"role": "user", "content": "x"}])

    assert render("{{ strftime_now('%Y') | length }}") == "4"
    with pytest.raises(InvalidRequestError):
        render("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}")
    with pytest.raises(InvalidRequestError):
        render("{% set ns = namespace(_x=1) %}")
    with pytest.raises(InvalidRequestError):
        render("{{ messages.append(1) }}")  # immutable sandbox
    assert render("{% generation %}kept{% endgeneration %}") == "kept"


def test_template_sources(tmp_path: Path) -> None:
    family = FAMILIES["qwen2"]
    trained = train(family)
    d = save_hf_dir(trained, family, tmp_path / "cfg", chat_template="from config {{ messages[0].content }}")
    tok = tokenizer_from_hf_dir(d)
    assert tok.chat_template_source == "tokenizer_config.json"
    assert apply_chat_template(tok, [{"role": "user", "content": "x"}]) == "from config x"
    (d / "chat_template.jinja").write_text("from file")
    assert tokenizer_from_hf_dir(d).chat_template_source == "chat_template.jinja"
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "named default"}]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    (d / "chat_template.jinja").unlink()
    assert tokenizer_from_hf_dir(d).chat_template == "named default"
    g = tokenizer_from_gguf(save_gguf(trained, family, tmp_path / "t.gguf", chat_template="gguf {{ bos_token }}"))
    assert g.chat_template_source == "GGUF metadata (tokenizer.chat_template)"
    assert apply_chat_template(g, [{"role": "user", "content": "x"}]) == "gguf "
