"""A plain completion chunk rendered without pydantic says what the pydantic model says."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from aserve.outputs import Delta
from aserve.server.render import CompletionChunks, Echo, PromptIds
from aserve.server.responses import CompletionChoice, CompletionResponse
from aserve.server.sse import event


def _parse(raw: bytes) -> dict[str, Any]:
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    return dict(json.loads(raw[6:-2]))


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(),  # any str: quotes, backslashes, control characters, U+2028, astral planes
    index=st.integers(0, 3),
    finish=st.sampled_from([None, "stop", "length", "abort"]),
    rid=st.text(min_size=1, max_size=40),
    model=st.text(min_size=1, max_size=40),
    ids=st.none() | st.lists(st.integers(0, 262143), min_size=1, max_size=5),  # return_token_ids
    prompts=st.lists(st.lists(st.integers(0, 262143), max_size=6), min_size=4, max_size=4),
)
def test_plain_chunk_equals_the_model(
    text: str, index: int, finish: str | None, rid: str, model: str, ids: list[int] | None, prompts: list[list[int]]
) -> None:
    prompt_ids = None if ids is None else PromptIds(prompts, 1)
    maker = CompletionChunks(None, rid, model, want_logprobs=False, ids=prompt_ids)  # type: ignore[arg-type]  # no tokenizer needed
    for first in (True, False):  # a choice's first chunk carries its prompt's ids; the next ones do not
        delta = Delta(index=index, text=text, token_ids=ids or [1], finish_reason=finish)
        fast = maker.delta(delta)
        assert isinstance(fast, bytes)
        choice = CompletionChoice(index=index, text=text, logprobs=None, finish_reason=finish)
        if ids is not None:
            choice.token_ids = ids
            choice.prompt_token_ids = prompts[index] if first else None
        reference = event(CompletionResponse(id=rid, model=model, choices=[choice]))
        got, want = _parse(fast), _parse(reference)
        assert abs(got.pop("created") - want.pop("created")) <= 1
        assert got == want
        assert list(got["choices"][0]) == list(want["choices"][0])  # the same keys in the same order


def test_chunks_with_logprobs_or_echo_still_go_through_the_model() -> None:
    d = Delta(index=0, text="x", token_ids=[5])
    assert not isinstance(CompletionChunks(None, "r", "m", True).delta(d), bytes)  # type: ignore[arg-type]
    assert not isinstance(
        CompletionChunks(None, "r", "m", False, echo=Echo(ids=[[1]], n=1, texts=["p"], decoded=[False])).delta(d), bytes
    )  # type: ignore[arg-type]
