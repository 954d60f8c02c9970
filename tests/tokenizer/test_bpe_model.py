"""A tiny random Qwen2 checkpoint whose tokenizer is a trained byte-level BPE (tokenizer.json and
chat_template.jinja only, no tokenizer.model): greedy tokens and text equal transformers', through
the engine and through the real server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import torch

import aserve
from tests.server.helpers import AUTH, running_server
from tests.tiny import hf_greedy
from tests.tokenizer.bpe import FAMILIES, save_hf_dir, train

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PROMPTS = ["def f(x):\n    return", "日本語 and emoji 🦙 then", "Numbers 123 and   spaces"]
MAX_NEW = 16


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    transformers = pytest.importorskip("transformers")
    family = FAMILIES["qwen2"]
    trained = train(family)
    root = save_hf_dir(trained, family, tmp_path_factory.mktemp("qwen_bpe"))
    (root / "chat_template.jinja").write_text(CHATML)
    vocab = trained.get_vocab_size()
    eos = trained.token_to_id("<|im_end|>")
    cfg = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=eos, pad_token_id=trained.token_to_id("<|endoftext|>"),
    )  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            # Peaked logits keep greedy decoding away from near-ties between implementations.
            p.normal_(0.0, 0.5 if "embed" in name or "lm_head" in name else 0.15)
    hf.eval()
    hf.config._attn_implementation = "eager"
    hf.save_pretrained(root, safe_serialization=True)
    return root, hf, transformers.AutoTokenizer.from_pretrained(str(root))


def test_engine_greedy_and_text_match_transformers(qwen: tuple[Path, Any, Any]) -> None:
    root, hf, ref = qwen
    params = aserve.SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True, skip_special_tokens=False)

    async def run() -> tuple[list[aserve.CompletionResult], dict[str, Any], list[str]]:
        async with aserve.Engine(model=str(root), device="cpu", warmup=False) as engine:  # the reference's device
            results = [await engine.complete(p, params) for p in PROMPTS]
            streamed = []
            for p in PROMPTS:
                streamed.append("".join([d.text async for d in engine.generate(p, params)]))
            return results, engine.info(), streamed

    results, info, streamed = anyio.run(run)
    assert info["tokenizer"] == "tokenizers: tokenizer.json"
    assert info["chat_template"] == "chat_template.jinja"
    for prompt, res, text in zip(PROMPTS, results, streamed):
        ids = ref(prompt).input_ids
        want, _ = hf_greedy(hf, ids, MAX_NEW)
        assert res.token_ids == want, prompt
        assert res.text == text == ref.decode(want, skip_special_tokens=False)


def test_server_chat_matches_transformers(qwen: tuple[Path, Any, Any], tmp_path: Path) -> None:
    root, hf, ref = qwen
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Wie geht's? 🦙 日本"}]
    prompt = ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ids = ref(prompt, add_special_tokens=False).input_ids
    want, _ = hf_greedy(hf, ids, MAX_NEW)
    stop = {ref.convert_tokens_to_ids("<|im_end|>"), ref.convert_tokens_to_ids("<|endoftext|>")}
    cut = next((k for k, t in enumerate(want) if t in stop), len(want))
    with running_server("--model", str(root), "--served-model-name", "tiny", log_dir=tmp_path) as srv:
        r = httpx.post(
            srv.base_url + "/v1/chat/completions", headers=AUTH, timeout=60,
            json={"model": "tiny", "messages": msgs, "max_tokens": MAX_NEW, "temperature": 0, "logprobs": True},
        )  # fmt: skip
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == ref.decode(want[:cut], skip_special_tokens=True)
    assert choice["finish_reason"] == ("stop" if cut < len(want) else "length")
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    # Per-token strings are text, not byte-level spellings ("Ġ", "æĹ¥").
    tokens = [c["token"] for c in choice["logprobs"]["content"]]
    assert len(tokens) in (cut, cut + 1)  # with or without the stop token
    assert not any(ch in "".join(tokens) for ch in "ĠĊ")


def test_structured_outputs_over_a_byte_level_vocabulary(qwen: tuple[Path, Any, Any]) -> None:
    """The grammar engine walks byte-level BPE tokens (Ġ spellings as their bytes): a random
    model's sampled output still matches its regex, choice and JSON schema."""
    import json
    import re

    import jsonschema

    from aserve.sampling_params import StructuredOutputs

    root, _, _ = qwen
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["n"], "additionalProperties": False}  # fmt: skip
    specs = [StructuredOutputs(regex=r"[a-z]{2,5} \d{1,3}"), StructuredOutputs(choice=("日本語", "emoji 🦙")),
             StructuredOutputs(json=schema)]  # fmt: skip

    async def run() -> list[list[str]]:
        async with aserve.Engine(model=str(root), warmup=False) as engine:
            out = []
            for so in specs:
                texts = []
                for seed in range(4):
                    params = aserve.SamplingParams(max_tokens=40, temperature=1.0, seed=seed, structured_outputs=so)
                    texts.append((await engine.complete("x", params)).text)
                out.append(texts)
            return out

    regex_out, choice_out, json_out = anyio.run(run)
    assert all(re.fullmatch(r"[a-z]{2,5} \d{1,3}", t) for t in regex_out), regex_out
    assert all(t in ("日本語", "emoji 🦙") for t in choice_out), choice_out
    for t in json_out:
        jsonschema.validate(json.loads(t), schema)
