"""The commit point: the only place a request's user-visible truth changes.

For each sequence of a finished step, in the order it was launched (the snapshot), the
committer appends the sampled token to ``Req.output_ids``, checks the stop conditions,
hands the token to the request's output cell and, once no step in flight reads the
request any more, returns its KV and row. A result for a request that already finished
(overshoot: it was planned into the next step before its end was known) is dropped here:
never appended, never streamed, never counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aserve.device.step import Step, StepOutputs
from aserve.logs import get_logger
from aserve.outputs import TokenLogprob
from aserve.sampling.masks import advance_all
from aserve.scheduler.decode_batch import DecodeBlock
from aserve.scheduler.policy import Scheduler
from aserve.scheduler.req import Req
from aserve.tokenizer.detokenizer import IncrementalDetokenizer
from aserve.tokenizer.tokenizer import Tokenizer

log = get_logger("aserve.commit")


class Committer:
    def __init__(
        self,
        scheduler: Scheduler,
        tokenizer: Tokenizer,
        on_finish: Callable[[Req], None],
    ) -> None:
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.on_finish = on_finish
        # Text-side state for requests with stop strings (others detokenize on the consumer side).
        self._stop_detok: dict[int, IncrementalDetokenizer] = {}
        self.output_tokens = 0

    def commit(self, step: Step) -> None:
        self.finish_commit(step, self.advance(step))

    def advance(self, step: Step) -> dict[int, bool]:
        """The commit's first part: the step's grammar rows (known since launch) advance, all
        together (advance_all: one call, on the fill's pool at a large batch). Returns whether
        each row's grammar took its token, by the row's index in the step.

        Each request appears once in a step and nothing in :meth:`finish_commit` touches a
        matcher, so this is what advancing each in turn within the loop gave. The matchers are
        all a split step's masks read: the step loop fills them and launches that step's
        sampler between the two parts. A finished request's row is overshoot: not advanced.

        The step's outputs are read first, whatever it holds: that sampler may reuse the
        buffers they are in (a masked-argmax graph's, ``DecodeGraphs.masked_argmax``)."""
        token_ids = step.read_outputs().token_ids
        if not step.grammar_rows:
            return {}
        block, entries = step.block, step.entries
        n = 0 if block is None else len(block)
        rows = [
            (i, g)
            for i, g in step.grammar_rows
            if (entries[i - n].req if i >= n else block.reqs[i]).finish_reason is None  # type: ignore[union-attr]
        ]
        if not rows:
            return {}
        ok = advance_all([g for _, g in rows], [token_ids[i] for i, _ in rows])
        return {i: took for (i, _), took in zip(rows, ok, strict=True)}

    def finish_commit(self, step: Step, advanced: dict[int, bool]) -> None:
        """The rest of the commit, after :meth:`advance`: outputs, stops, cells, releases."""
        outs = step.read_outputs()
        token_ids, with_logprobs = outs.token_ids, outs.logprobs is not None
        now = time.perf_counter()
        # The block's decodes lead (indexes 0..n-1), the entries follow (n..).
        block, entries = step.block, step.entries
        n = 0 if block is None else len(block)
        if block is not None:
            block_tokens = token_ids[:n] if entries else token_ids
            self._commit_block(block, block_tokens, now, advanced)
        # Before the entries: the last prompt chunk's logprobs must be whole when its first
        # token reaches the cell.
        row = 0
        for i, first, count in step.prompt_spans:
            req = entries[i - n].req
            if req.finish_reason is None:
                self._prompt_logprobs(req, outs, row, first, count)
            row += count
        for i, entry in enumerate(entries, start=n):
            req = entry.req
            req.inflight -= 1
            assert req.inflight >= 0, f"{req.rid}: more commits than launches"
            if req.finish_reason is None:  # a finished request's token is overshoot: dropped
                ends_prefill = False
                if entry.input_ids is not None:
                    # A prefill chunk's KV is written now: publish it for other requests.
                    self.scheduler.prefix.publish(req, entry.kv_end)
                    ends_prefill = entry.kv_end == len(req.fill_ids)
                if ends_prefill and req.params.prompt_logprobs is not None and not req.prompt_logprobs:
                    req.prompt_logprobs.append(None)  # a one-token prompt: nothing to compute
                    if req.cell is not None:
                        req.cell.prompt_logprobs = req.prompt_logprobs
                if ends_prefill and not entry.samples:
                    # max_tokens 0: the prompt is prefilled (and its logprobs are in the cell)
                    # and nothing is sampled; the request ends here by length.
                    assert req.length_reached(len(req.output_ids)), f"{req.rid}: last chunk without a sample"
                    self.finish(req, "length")
                if entry.samples:
                    assert req.generation == entry.generation, (
                        f"{req.rid}: row generation {req.generation} != launched {entry.generation}"
                    )
                    logprob = None
                    if with_logprobs and req.params.logprobs is not None:
                        logprob = self._logprob(outs, i, req.params.logprobs)
                    self._append(req, token_ids[i], logprob, now, advanced.get(i))
            if req.finish_reason is not None:
                self.scheduler.release_if_done(req)

    def _commit_block(self, block: DecodeBlock, token_ids: list[int], now: float, advanced: dict[int, bool]) -> None:
        """A block's decodes (no logprobs, stop strings or ``min_tokens``; a grammar maybe,
        already advanced: ``advanced`` by index): ``_append`` with the branches these
        requests never take left out. A row's generation cannot change while a step in
        flight holds its request (rows return at the safe point), so the general path's
        generation check runs here in debug mode only."""
        reqs = block.reqs
        if self.scheduler.config.debug:
            for req, gen in zip(reqs, block.gens, strict=True):
                assert req.finish_reason is not None or req.generation == gen, f"{req.rid}: row generation changed"
        committed = 0
        release = self.scheduler.release_if_done
        for i, (req, token) in enumerate(zip(reqs, token_ids, strict=True)):
            req.inflight -= 1
            assert req.inflight >= 0, f"{req.rid}: more commits than launches"
            if req.finish_reason is not None:  # overshoot: dropped
                release(req)
                continue
            outputs = req.output_ids
            outputs.append(token)
            committed += 1
            if req.first_token_time is None:
                req.first_token_time = now
            cell = req.cell
            assert cell is not None, f"{req.rid} was admitted without an output cell"
            cell.push(token, None)
            grammar = req.grammar
            if grammar is not None and not advanced[i]:  # as in _append (a live member was advanced)
                log.warning("grammar_rejected_token", rid=req.rid, token=token, error=grammar.error)
                self.finish(req, "stop")
            elif token in req.stop_ids:
                self.finish(req, "stop", token if token in req.params.stop_token_ids else None)
            elif grammar is not None and grammar.done:
                self.finish(req, "stop")
            elif len(outputs) >= req.max_new_tokens:
                self.finish(req, "length")
            else:
                continue
            release(req)
        self.output_tokens += committed

    @staticmethod
    def _prompt_logprobs(req: Req, outs: StepOutputs, row: int, first: int, count: int) -> None:
        lps, top_ids, top_lps = outs.prompt_logprobs, outs.prompt_top_ids, outs.prompt_top_logprobs
        assert lps is not None and top_ids is not None and top_lps is not None, "prompt rows without outputs"
        got = req.prompt_logprobs
        if not got:
            got.append(None)  # the first prompt token: nothing precedes it
        k = req.params.prompt_logprobs or 0
        for r in range(row, row + count):
            pos = first + r - row
            if pos != len(got):
                continue  # recomputed after a retraction: kept from the first time
            got.append(TokenLogprob(req.prompt_ids[pos], lps[r], tuple(zip(top_ids[r][:k], top_lps[r][:k]))))
        if len(got) == len(req.prompt_ids) and req.cell is not None:
            req.cell.prompt_logprobs = got

    @staticmethod
    def _logprob(outs: StepOutputs, i: int, k: int) -> TokenLogprob:
        assert outs.logprobs is not None
        top: tuple[tuple[int, float], ...] = ()
        if outs.top_ids is not None and outs.top_logprobs is not None:
            top = tuple(zip(outs.top_ids[i][:k], outs.top_logprobs[i][:k]))
        return TokenLogprob(outs.token_ids[i], outs.logprobs[i], top)

    def _append(self, req: Req, token: int, logprob: TokenLogprob | None, now: float, advanced: bool | None) -> None:
        """``advanced``: whether the request's grammar took the token (``commit`` advanced it),
        None without a grammar."""
        cell, outputs, params = req.cell, req.output_ids, req.params
        assert cell is not None, f"{req.rid} was admitted without an output cell"
        outputs.append(token)
        self.output_tokens += 1
        if logprob is not None:
            req.output_logprobs.append(logprob)
        if req.first_token_time is None:
            req.first_token_time = now
        cell.push(token, logprob)
        # Under min_tokens nothing stops the request early (the sampler banned its stop ids;
        # stop strings are not looked for in text that ends before min_tokens).
        may_stop = len(outputs) >= params.min_tokens
        grammar = req.grammar
        if grammar is not None and advanced is False:
            # The sampler only draws allowed tokens, so this is a fault: end the output here
            # rather than continue it outside its language.
            log.warning("grammar_rejected_token", rid=req.rid, token=token, error=grammar.error)
            self.finish(req, "stop")
        elif token in req.stop_ids and may_stop:
            self.finish(req, "stop", token if token in params.stop_token_ids else None)
        elif params.stop and self._hit_stop_string(req, token, may_stop):
            pass  # finished inside
        elif grammar is not None and grammar.done:
            self.finish(req, "stop")  # the language allows nothing more: the output is complete
        elif req.length_reached(len(outputs)):
            self.finish(req, "length")

    def _hit_stop_string(self, req: Req, token: int, may_stop: bool = True) -> bool:
        detok = self._stop_detok.get(id(req))
        if detok is None:
            detok = IncrementalDetokenizer(self.tokenizer, skip_special_tokens=req.params.skip_special_tokens)
            self._stop_detok[id(req)] = detok
        before = len(detok.text)
        detok.push([token])
        if not may_stop:
            return False  # the text is kept: a stop string may end after min_tokens
        text = detok.text
        longest = max(len(s) for s in req.params.stop)
        start = max(0, before - longest + 1)
        best: tuple[int, str] | None = None
        for s in req.params.stop:
            at = text.find(s, start)
            if at != -1 and (best is None or at < best[0]):
                best = (at, s)
        if best is None:
            return False
        at, s = best
        assert req.cell is not None
        req.cell.text_limit = at + len(s) if req.params.include_stop_str_in_output else at
        self.finish(req, "stop", s)
        return True

    def fail(self, req: Req, error: BaseException) -> None:
        """End ``req`` with ``error`` for its consumer (it cannot make progress)."""
        self.finish(req, "abort")
        if req.cell is not None:
            req.cell.fail(error)

    def finish(self, req: Req, reason: str, stop_reason: str | int | None = None) -> None:
        assert reason in ("stop", "length", "abort")
        req.finish_reason = reason  # type: ignore[assignment]
        req.stop_reason = stop_reason
        req.finish_time = time.perf_counter()
        if req.cell is not None:
            req.cell.finish(req.finish_reason, stop_reason)  # type: ignore[arg-type]
        self._stop_detok.pop(id(req), None)
        self.scheduler.note_ended(req)
        self.on_finish(req)
