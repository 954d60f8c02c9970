"""A plain completion chunk rendered without pydantic says what the pydantic model says."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from aserve.outputs import Delta
from aserve.server.render import CompletionChunks
from aserve.server.responses import CompletionChoice, CompletionResponse
from aserve.server.sse import event


def _parse(raw: bytes) -> dict[str, Any]:
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    return dict(json.loads(raw[6:-2]))


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(),  # any str: quotes, backslashes, control characters, U+2028, astral planes
    index=st.integers(0, 1000),
    finish=st.sampled_from([None, "stop", "length", "abort"]),
    rid=st.text(min_size=1, max_size=40),
    model=st.text(min_size=1, max_size=40),
)
def test_plain_chunk_equals_the_model(text: str, index: int, finish: str | None, rid: str, model: str) -> None:
    maker = CompletionChunks(None, rid, model, want_logprobs=False)  # type: ignore[arg-type]  # no tokenizer needed
    fast = maker.delta(Delta(index=index, text=text, token_ids=[1], finish_reason=finish))  # type: ignore[arg-type]
    assert isinstance(fast, bytes)
    reference = event(CompletionResponse(id=rid, model=model, choices=[
        CompletionChoice(index=index, text=text, logprobs=None, finish_reason=finish)]))  # fmt: skip
    got, want = _parse(fast), _parse(reference)
    assert abs(got.pop("created") - want.pop("created")) <= 1
    assert got == want


def test_chunks_with_logprobs_echo_or_ids_still_go_through_the_model() -> None:
    from aserve.server.render import Echo, PromptIds

    d = Delta(index=0, text="x", token_ids=[5])
    assert not isinstance(CompletionChunks(None, "r", "m", False, ids=PromptIds([[1]], 1)).delta(d), bytes)  # type: ignore[arg-type]
    assert not isinstance(
        CompletionChunks(None, "r", "m", False, echo=Echo(ids=[[1]], n=1, texts=["p"])).delta(d), bytes
    )  # type: ignore[arg-type]
