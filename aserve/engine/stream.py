"""A request's stream: what a consumer reads of its committed tokens, as ``Delta``s.

The committer leaves tokens in each sequence's :class:`~aserve.engine.cell.OutputCell` and
never waits; the consumer takes everything waiting at once, detokenizes it incrementally (on
the consumer's side, not the committer's) and holds back the last characters that could
still begin a stop string. Leaving the stream early aborts its requests.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable

import anyio

from aserve.engine.cell import OutputCell
from aserve.errors import AserveError, RequestAbortedError
from aserve.outputs import CompletionOutput, CompletionResult, Delta, TokenLogprob, Usage
from aserve.scheduler.req import Req
from aserve.tokenizer.detokenizer import IncrementalDetokenizer
from aserve.tokenizer.tokenizer import Tokenizer


def cell_of(req: Req) -> OutputCell:
    assert req.cell is not None, f"{req.rid} was admitted without an output cell"
    return req.cell


async def stream_deltas(
    reqs: list[Req], tokenizer: Tokenizer, abort: Callable[[Req], None], detokenize: bool = True
) -> AsyncGenerator[Delta, None]:
    """Yield the deltas of submitted ``reqs`` (the ``n`` choices of one call, or of each of
    several prompts in turn) as they commit; ``Delta.index`` is the position in ``reqs``.

    ``detokenize=False``: deltas carry token ids only (``text`` stays empty). Closing the
    generator or cancelling its consumer aborts every unfinished request (``abort``); a
    request that failed raises its typed error (``KVCapacityError``, say) or
    :class:`RequestAbortedError`."""
    cells = [cell_of(r) for r in reqs]
    signal = cells[0].signal
    params = reqs[0].params
    detoks = [IncrementalDetokenizer(tokenizer, skip_special_tokens=params.skip_special_tokens) for _ in reqs]
    hold = max((len(s) for s in params.stop), default=1) - 1
    emitted = [0] * len(reqs)
    done = [False] * len(reqs)
    first_sent = [False] * len(reqs)  # the first delta of each choice carries the prompt's logprobs
    try:
        while not all(done):
            progressed = False
            for i, (req, cell) in enumerate(zip(reqs, cells, strict=True)):
                if done[i] or not cell.ready():
                    continue
                finished = cell.finished
                ids, lps = cell.take_nowait()
                if cell.error is not None:
                    if isinstance(cell.error, AserveError):
                        raise cell.error
                    raise RequestAbortedError(f"request {req.rid} failed: {cell.error}") from cell.error
                new_text = ""
                if detokenize:
                    detok = detoks[i]
                    detok.push(ids)
                    if finished:
                        detok.flush()
                    text = detok.text
                    if finished:
                        limit = len(text) if cell.text_limit is None else cell.text_limit
                    else:
                        limit = len(text) - hold
                    new_text = text[emitted[i] : limit] if limit > emitted[i] else ""
                    emitted[i] = max(emitted[i], limit)
                progressed = True
                if finished:
                    done[i] = True
                if not ids and not new_text and not finished:
                    continue
                prompt_lps = None
                if params.prompt_logprobs is not None and not first_sent[i]:
                    prompt_lps = cell.prompt_logprobs
                first_sent[i] = True
                yield Delta(
                    index=i,
                    text=new_text,
                    token_ids=ids,
                    finish_reason=cell.finish_reason if finished else None,
                    stop_reason=cell.stop_reason if finished else None,
                    logprobs=lps if params.logprobs is not None else None,
                    prompt_logprobs=prompt_lps,
                )
            if not progressed:
                await signal.wait()
    finally:
        for req in reqs:
            if not req.finished:
                abort(req)


async def collect_result(reqs: list[Req], tokenizer: Tokenizer, abort: Callable[[Req], None]) -> CompletionResult:
    """Read submitted ``reqs`` to the end (token ids only while they run; the text is decoded
    once at the end, off the loop's per-step path) and return the whole result. Cancelling the
    caller aborts them."""
    params = reqs[0].params
    outputs = [CompletionOutput(index=i, text="", token_ids=[], finish_reason=None) for i in range(len(reqs))]
    logprobs: list[list[TokenLogprob]] = [[] for _ in reqs]
    async with contextlib.aclosing(stream_deltas(reqs, tokenizer, abort, detokenize=False)) as stream:
        async for delta in stream:
            out = outputs[delta.index]
            out.token_ids.extend(delta.token_ids)
            if delta.logprobs:
                logprobs[delta.index].extend(delta.logprobs)
            if delta.prompt_logprobs is not None:
                out.prompt_logprobs = delta.prompt_logprobs
            if delta.finish_reason is not None:
                out.finish_reason = delta.finish_reason
                out.stop_reason = delta.stop_reason
    for req, out, lps in zip(reqs, outputs, logprobs, strict=True):
        text = tokenizer.decode(out.token_ids, params.skip_special_tokens)
        limit = cell_of(req).text_limit
        out.text = text if limit is None else text[:limit]
        out.logprobs = lps if params.logprobs is not None else None
    first = reqs[0]
    heads = _prompt_heads(reqs)
    metrics: dict[str, float] = {}
    if first.first_token_time is not None:
        metrics["ttft_s"] = first.first_token_time - first.arrival
    if first.finish_time is not None:
        metrics["e2e_s"] = first.finish_time - first.arrival
    return CompletionResult(
        request_id=first.group_id,
        prompt_token_ids=list(first.prompt_ids),
        outputs=outputs,
        usage=Usage(
            sum(len(r.prompt_ids) for r in heads),
            sum(len(o.token_ids) for o in outputs),
            sum(r.cached_prompt_tokens for r in heads),
        ),
        metrics=metrics,
    )


def _prompt_heads(reqs: list[Req]) -> list[Req]:
    """The first choice of each prompt (usage counts a prompt once, whatever ``n``)."""
    return [r for r in reqs if r.index == 0]


class RequestStream:
    """Deltas of a submitted request (``Engine.open_stream``); ``aclose`` aborts it."""

    def __init__(
        self,
        reqs: list[Req],
        tokenizer: Tokenizer,
        abort: Callable[[Req], None],
        admitted: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._reqs = reqs
        self._abort = abort
        self._admitted = admitted
        self._gen = stream_deltas(reqs, tokenizer, abort)
        self._ended: set[int] = set()  # choices whose last delta was handed out

    async def admitted(self) -> None:
        """Returns once the engine took the request, or raises the typed error it refused it
        with. An embedded engine admits in ``open_stream`` itself; an engine core in another
        process answers over IPC (a 429 must still come before the response's headers)."""
        if self._admitted is not None:
            await self._admitted()

    @property
    def request_id(self) -> str:
        return self._reqs[0].group_id

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache (0 until the request is admitted)."""
        return sum(r.cached_prompt_tokens for r in _prompt_heads(self._reqs))

    async def wait_output(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a choice to have output to take (or to end); False
        when the time ran out. Cancel-safe, unlike a timeout around ``__anext__``, which
        would end the stream (and abort the request)."""
        cells = [cell_of(r) for i, r in enumerate(self._reqs) if i not in self._ended]
        if not cells or any(c.ready() for c in cells):
            return True  # at its end, or output waits: no timer (a busy front end's common case)
        with anyio.move_on_after(timeout_s):
            while not any(c.ready() for c in cells):
                await cells[0].signal.wait()
            return True
        return False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Delta:
        delta = await self._gen.__anext__()
        if delta.finish_reason is not None:
            self._ended.add(delta.index)
        return delta

    async def aclose(self) -> None:
        """Abort the request if unfinished (at once, started or not) and close the stream."""
        for req in self._reqs:
            if not req.finished:
                self._abort(req)
        await self._gen.aclose()
