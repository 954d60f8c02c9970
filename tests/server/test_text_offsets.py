"""``text_offset`` in completion logprobs points into the choice's text: each token's offset is
the length of the text decoded from the tokens before it (the tokenizer's own ``decode`` is the
reference), with the default model's tokenizer, byte-fallback characters and BOS included."""

from __future__ import annotations

from typing import Any

import pytest

from aserve.outputs import TokenLogprob
from aserve.server.render import CompletionLogprobs, Echo, TextOffsets, completion_logprobs, echo_logprobs

TEXTS = [
    "The capital of France is Paris.",
    "Emoji 🎉 and 漢字, then more: naïve café ✓",
    "line one\nline two\ttabbed  double  spaced",
]


@pytest.mark.parametrize("text", TEXTS)
def test_offsets_are_the_decoded_length_before_each_token(tokenizer: Any, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=True)
    assert tokenizer.is_special(ids[0])  # BOS leads
    offsets = TextOffsets(tokenizer)
    got = [offsets.take(t) for t in ids]
    want = [len(tokenizer.decode(ids[:i])) for i in range(len(ids))]
    assert got == want
    assert offsets.chars == len(tokenizer.decode(ids)) == len(text)


def _lps(ids: list[int]) -> list[TokenLogprob]:
    return [TokenLogprob(token_id=t, logprob=-1.0) for t in ids]


def test_echoed_prompt_and_completion_offsets_index_the_choice_text(tokenizer: Any) -> None:
    prompt, completion = "Hello there", " 🎉 done"
    p_ids = tokenizer.encode(prompt, add_special_tokens=True)
    c_ids = tokenizer.encode(completion)
    # A string prompt is echoed as sent (no BOS text); an ids prompt as its ids decoded with BOS.
    for decoded, echoed in ((False, prompt), (True, tokenizer.decode(p_ids, skip_special_tokens=False))):
        echo = Echo(ids=[p_ids], n=1, texts=[echoed], decoded=[decoded])
        offsets = TextOffsets(tokenizer)
        head = echo_logprobs(tokenizer, echo, 0, None, offsets)
        lps: CompletionLogprobs = completion_logprobs(tokenizer, _lps(c_ids), offsets, head)
        text = echoed + tokenizer.decode(c_ids)
        bos_text = len(tokenizer.decode(p_ids[:1], skip_special_tokens=False)) if decoded else 0
        assert lps.text_offset[:2] == [0, bos_text]
        # Every whole-character token's text starts at its offset.
        for tok_text, at in zip(lps.tokens, lps.text_offset, strict=True):
            if tok_text and "\ufffd" not in tok_text and not tok_text.startswith("<"):
                assert text[at : at + len(tok_text)] == tok_text, (tok_text, at, text)
        assert offsets.chars == len(text)
