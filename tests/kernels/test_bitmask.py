"""The in-place bitmask kernel vs the torch definition the CPU path runs (allowed_tokens, then
masked_fill). On a CPU the kernel runs in Triton's interpreter (tests/conftest.py sets
TRITON_INTERPRET)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from aserve.kernels.bitmask import apply_bitmask_, argmax_, argmax_scratch
from aserve.sampling.fsm import DeviceAutomaton
from aserve.sampling.masks import allowed_tokens, mask_words

pytestmark = pytest.mark.slow

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16] if DEVICE == "cuda" else [torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "vocab", "rows"), [(5, 1000, [0, 2, 4]), (3, 2048, [1]), (4, 33, [3, 0, 1, 2])])
def test_matches_the_torch_definition(dtype: torch.dtype, batch: int, vocab: int, rows: list[int]) -> None:
    g = torch.Generator().manual_seed(vocab + batch)
    logits = torch.randn(batch, vocab, generator=g).to(DEVICE, dtype)
    # Random words, plus one row that allows everything and one that allows a single token.
    bits = torch.randint(-(2**31), 2**31 - 1, (len(rows), mask_words(vocab)), generator=g, dtype=torch.int32)
    bits[0] = -1
    if len(rows) > 1:
        bits[1] = 0
        bits[1, 0] = 1 << 5
    bits = bits.to(DEVICE)
    row_t = torch.tensor(rows, dtype=torch.int64, device=DEVICE)

    expected = logits.clone()
    allowed = allowed_tokens(bits, vocab)
    expected[row_t] = expected[row_t].masked_fill(~allowed, float("-inf"))

    out = logits.clone()
    assert apply_bitmask_(out, row_t, bits) is out
    assert torch.equal(out, expected)
    untouched = [r for r in range(batch) if r not in rows]
    assert torch.equal(out[untouched], logits[untouched])  # rows without a grammar keep their logits
    if len(rows) > 1:
        assert torch.isfinite(out[rows[1]]).sum().item() == 1 and torch.isfinite(out[rows[1], 5])


def test_no_rows_is_a_no_op() -> None:
    logits = torch.randn(2, 100, device=DEVICE)
    out = apply_bitmask_(logits.clone(), torch.empty(0, dtype=torch.int64, device=DEVICE),
                         torch.empty((0, 4), dtype=torch.int32, device=DEVICE))  # fmt: skip
    assert torch.equal(out, logits)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "vocab", "rows"),
                         [(5, 1000, [0, 2, 4]), (3, 20000, [1]), (4, 33, [3, 0, 1, 2]), (2, 9000, [1, 0]),
                          (520, 4500, list(range(519, -1, -1)))])  # fmt: skip
def test_masked_argmax_is_the_argmax_of_the_masked_logits(
    dtype: torch.dtype, batch: int, vocab: int, rows: list[int]
) -> None:
    """Few distinct logits (many ties), against the torch definition; 520 rows make one
    program a row, whose loop meets equal maxima at one tile position in turn."""
    from aserve.kernels.bitmask import masked_argmax_

    g = torch.Generator().manual_seed(vocab * 7 + batch)
    # Few distinct values: equal maxima are common, and the first of them must win.
    logits = torch.randint(-4, 5, (batch, vocab), generator=g).to(DEVICE, dtype)
    bits = torch.randint(-(2**31), 2**31 - 1, (len(rows), mask_words(vocab)), generator=g, dtype=torch.int32)
    bits[0] = -1  # a row the grammar leaves open
    if len(rows) > 1:
        bits[1] = 0  # one that allows nothing: token 0, as torch.argmax of an all -inf row
    if len(rows) > 2:
        bits[2] = 0
        bits[2, -1] = 1 << ((vocab - 1) % 32)  # only the last token
    bits = bits.to(DEVICE)
    row_t = torch.tensor(rows, dtype=torch.int64, device=DEVICE)

    masked = logits.clone()  # the torch definition, on either device
    masked[row_t] = masked[row_t].masked_fill(~allowed_tokens(bits, vocab), float("-inf"))
    expected = masked.argmax(dim=-1)
    out = torch.full((batch,), -7, dtype=torch.int64, device=DEVICE)
    assert masked_argmax_(out, logits, row_t, bits) is out
    assert torch.equal(out[row_t], expected[row_t])
    untouched = [r for r in range(batch) if r not in rows]
    assert (out[untouched] == -7).all()  # rows without a grammar are not written
    if len(rows) > 2:
        assert out[rows[2]].item() == vocab - 1


def _masked_reference(logits: torch.Tensor, rows: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    masked = logits.clone()  # the torch definition, on either device
    masked[rows] = masked[rows].masked_fill(~allowed_tokens(bits, logits.shape[1]), float("-inf"))
    return masked.argmax(dim=-1)


def test_masked_argmax_ties_across_programs_and_repeated_launches() -> None:
    """A row's vocabulary split over several programs (20,000 tokens: ten), equal maxima in
    different programs' ranges (the lesser token wins), -0.0 against +0.0 (one value), and
    launch after launch on the same scratch (each leaves it as it found it)."""
    from aserve.kernels.bitmask import masked_argmax_

    vocab, batch = 20000, 3
    rows = torch.tensor([2, 0, 1], dtype=torch.int64, device=DEVICE)
    bits = torch.full((3, mask_words(vocab)), -1, dtype=torch.int32, device=DEVICE)
    for trial in range(3):
        logits = torch.full((batch, vocab), -5.0, device=DEVICE)
        logits[2, 19000] = logits[2, 4100 + trial] = 3.0  # the tie, two programs apart
        logits[0, 0] = -0.0
        logits[0, 12345] = 0.0  # row 0: -0.0 first, then +0.0 further on: token 0
        logits[1, 7 + trial] = 1.0
        out = torch.full((batch,), -7, dtype=torch.int64, device=DEVICE)
        masked_argmax_(out, logits, rows, bits)
        assert out.tolist() == [0, 7 + trial, 4100 + trial] == _masked_reference(logits, rows, bits).tolist()


@pytest.mark.parametrize("batch", [1, 6, 600])
def test_masked_argmax_publishes_into_the_mailboxes(batch: int) -> None:
    """With ``publish``, each constrained row's token also goes to its table row's mailbox (a
    FutureMap's), and nothing else is written there; the tokens are the torch definition's."""
    from aserve.kernels.bitmask import masked_argmax_

    vocab = 3000
    g = torch.Generator().manual_seed(batch)
    logits = torch.randn(batch, vocab, generator=g).to(DEVICE)
    rows = torch.arange(0, batch, 2, dtype=torch.int64, device=DEVICE)  # every other row constrained
    bits = torch.randint(-(2**31), 2**31 - 1, (rows.shape[0], mask_words(vocab)), generator=g, dtype=torch.int32)
    bits = bits.to(DEVICE)
    table_rows = (torch.randperm(batch, generator=g) + 5).to(DEVICE)  # the step's rows in the table
    mailboxes = torch.full((batch + 5,), -3, dtype=torch.int64, device=DEVICE)
    out = torch.full((batch,), -7, dtype=torch.int64, device=DEVICE)
    masked_argmax_(out, logits, rows, bits, publish=(mailboxes, table_rows))
    expected = _masked_reference(logits, rows, bits)
    assert torch.equal(out[rows], expected[rows])
    want = torch.full_like(mailboxes, -3)
    want[table_rows[rows]] = expected[rows]
    assert torch.equal(mailboxes, want)


def _random_automaton(states: int, vocab: int, g: torch.Generator) -> DeviceAutomaton:
    """Tables in DeviceAutomaton's form, at random: a mask table with one all-ones row, each
    state's mask among them, and ascending keys with random destinations (the kernel's binary
    search against DeviceAutomaton.step's searchsorted, whatever the keys)."""
    words = mask_words(vocab)
    masks = torch.randint(-(2**31), 2**31 - 1, (5, words), generator=g, dtype=torch.int32)
    masks[-1] = -1
    masks[0] = 0
    masks[0, 1] = 1 << 3  # a mask that allows one token (35)
    mask_of = torch.randint(0, 5, (states,), generator=g)
    mask_of[1] = 0
    stride = words * 32
    # No key of state 0: its queries are below every key (after[0]). State 1 allows token 35
    # alone, whose query is a key itself (as every move of a real automaton is).
    # The last state (done) has one key, the largest: its queries are above every other key
    # and lead back to it (after[M]).
    own = torch.tensor([stride, stride + 35, stride + 36, (states - 1) * stride])
    keys = torch.cat([own, torch.randint(2 * stride, (states - 1) * stride, (40,), generator=g)]).unique().sort().values
    after = torch.randint(0, states, (keys.shape[0] + 1,), generator=g)
    after[1:4] = torch.tensor([2, 5, 2])  # after state 1's base key, its token 35's own key, token 36's
    after[-1] = states - 1
    return DeviceAutomaton(masks.to(DEVICE), mask_of.to(DEVICE), keys.to(DEVICE), after.to(DEVICE), stride, states - 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "vocab"), [(1, 5000), (6, 70_001), (300, 33)])
def test_argmax_without_a_mask_is_torchs_argmax(dtype: torch.dtype, batch: int, vocab: int) -> None:
    """The decode graph's greedy argmax (every token allowed, no mask read): torch.argmax's
    tokens, the first of equal maxima, published into the mailboxes. Coarse values make ties
    within a program and across a row's programs (6 rows of 70k split a row over many)."""
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randint(-40, 40, (batch, vocab), generator=g).to(DEVICE, dtype) / 8
    logits[0, -1] = 100.0  # the last token, past the last full word when vocab % 32 != 0
    if batch > 2:
        logits[2] = -1.0  # -0.0 and 0.0 are one value: the first of them, token 0
        logits[2, 0] = -0.0
        logits[2, vocab // 2] = 0.0
    rows = torch.arange(batch, device=DEVICE)
    table_rows = torch.randperm(batch, generator=g).to(DEVICE)
    scratch = argmax_scratch(batch, torch.device(DEVICE))
    for _ in range(2):  # the second launch: other logits, the scratch as the first launch left it
        mailboxes = torch.full((batch + 2,), -3, dtype=torch.int64, device=DEVICE)
        out = torch.full((batch,), -7, dtype=torch.int64, device=DEVICE)
        argmax_(out, logits, rows, (mailboxes, table_rows), scratch)
        want = logits.argmax(dim=-1)
        assert torch.equal(out, want)
        assert torch.equal(mailboxes[table_rows], want) and (mailboxes[batch:] == -3).all()
        logits = logits.flip(0) - 200  # lower keys than the first launch's: a stale key would win
    assert int(want[-1]) == vocab - 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "vocab", "rows"), [(6, 3000, [4, 1, 3, 0, 5]), (300, 700, list(range(299, -1, -1)))])
def test_automaton_argmax_is_the_masks_the_argmax_and_the_step(
    dtype: torch.dtype, batch: int, vocab: int, rows: list[int]
) -> None:
    """One launch against DeviceAutomaton's own three steps (masks_of, the masked argmax,
    step), over a walk of launches: each row's state from the host (start) or from the
    device, its token drawn over that state's mask and published, its next state left on the
    device; other rows' states and tokens untouched. 6 rows split each row's vocabulary over
    several programs; 300 give a program a row."""
    from aserve.kernels.bitmask import automaton_argmax_

    g = torch.Generator().manual_seed(batch + vocab)
    auto = _random_automaton(9, vocab, g)
    row_t = torch.tensor(rows, dtype=torch.int64, device=DEVICE)
    state_rows = (torch.randperm(batch, generator=g) + 3).to(DEVICE)  # the batch rows' FutureMap rows
    states = torch.randint(0, 9, (batch + 3,), generator=g).to(DEVICE)
    mailboxes = torch.full((batch + 3,), -3, dtype=torch.int64, device=DEVICE)
    for walk in range(4):
        logits = torch.randint(-3, 4, (batch, vocab), generator=g).to(DEVICE, dtype)  # ties
        # The host's states on the first launch, then every other row's from the device; rows
        # 0-2 the host's each time: state 0 (below every key), 1 (one token allowed) and 8
        # (done: above every other key).
        start = torch.randint(0, 9, (len(rows),), generator=g).to(DEVICE)
        if walk:
            start[3::2] = -1
        start[:3] = torch.tensor([0, 1, 8])
        now = torch.where(start >= 0, start, states[state_rows[row_t]])
        expected = _masked_reference(logits, row_t, auto.masks_of(now))
        want_states = states.clone()
        want_states[state_rows[row_t]] = auto.step(now, expected[row_t])
        want_mail = mailboxes.clone()
        want_mail[state_rows[row_t]] = expected[row_t]
        out = torch.full((batch,), -7, dtype=torch.int64, device=DEVICE)
        assert automaton_argmax_(out, logits, row_t, auto, start, states, state_rows, (mailboxes, state_rows)) is out
        assert torch.equal(out[row_t], expected[row_t])
        assert (out[[r for r in range(batch) if r not in rows]] == -7).all()
        assert torch.equal(states, want_states)  # the rows' next states, and nothing else
        assert torch.equal(mailboxes, want_mail)
        assert out[rows[1]].item() == 35  # the one token state 1 allows, to state 5
        assert states[state_rows[rows[1]]].item() == 5
        assert states[state_rows[rows[2]]].item() == 8  # done stays done
