"""Host-only prototype: mask fill by P worker processes, each owning a mirror of its rows'
matchers, advancing them by the step's committed tokens and writing masks into shared memory;
the main process keeps its own matchers too (acceptance, done), as an engine would. Per step:
fill wall time (send tokens -> every worker done), the main's own advance, against the serial
in-process fill."""
import json, sys, time
import multiprocessing as mp
from multiprocessing import shared_memory

V = 262144
WORDS = (V + 31) // 32


def worker(tok_dir, rows_idx, shm_name, total_rows, conn):
    import torch  # noqa
    from aserve.tokenizer.loading import load_tokenizer
    from aserve.sampling.grammar import Grammars, _fill_rows
    from aserve.sampling_params import StructuredOutputs
    from aserve.bench.device_bench import STRUCTURED_BENCH_SCHEMA
    gr = Grammars(load_tokenizer(tok_dir), V)
    so = StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA)
    states = [gr.state(so) for _ in rows_idx]
    shm = shared_memory.SharedMemory(name=shm_name)
    import ctypes
    base = ctypes.addressof(ctypes.c_char.from_buffer(shm.buf))
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            break
        for s, t in zip(states, msg):
            if t >= 0:
                s.advance(t)
        for s, i in zip(states, rows_idx):
            m = s.matcher
            m.unsafe_compute_mask_ptr(base + i * WORDS * 4, WORDS * 4)
        conn.send(1)
    del base
    shm.close()


def main():
    tok_dir, out_path = sys.argv[1], sys.argv[2]
    import torch
    from aserve.tokenizer.loading import load_tokenizer
    from aserve.sampling.grammar import Grammars, _fill_rows, allowed_tokens
    from aserve.sampling_params import StructuredOutputs
    from aserve.bench.device_bench import STRUCTURED_BENCH_SCHEMA
    tok = load_tokenizer(tok_dir)
    gr = Grammars(tok, V)
    so = StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA)
    ctx = mp.get_context("spawn")
    results = []
    for rows in (64, 256):
        for procs in (0, 1, 2, 4, 8):
            states = [gr.state(so) for _ in range(rows)]
            shm = shared_memory.SharedMemory(create=True, size=rows * WORDS * 4)
            masks = torch.frombuffer(shm.buf, dtype=torch.int32).view(rows, WORDS)
            workers = []
            if procs:
                for w in range(procs):
                    idx = list(range(w, rows, procs))
                    a, b = ctx.Pipe()
                    p = ctx.Process(target=worker, args=(tok_dir, idx, shm.name, rows, b), daemon=True)
                    p.start()
                    workers.append((p, a, idx))
                for _, a, _ in workers:
                    assert a.recv() == "ready"
            last = [-1] * rows
            tf = ta = 0.0
            n = 0
            for step in range(30):
                t0 = time.perf_counter()
                if procs:
                    for _, a, idx in workers:
                        a.send([last[i] for i in idx])
                    for _, a, _ in workers:
                        a.recv()
                else:
                    _fill_rows(states, 0, rows, masks.data_ptr(), WORDS * 4)
                t1 = time.perf_counter()
                bits = allowed_tokens(masks, V)
                toks = torch.multinomial(bits.float(), 1, generator=torch.Generator().manual_seed(step)).flatten().tolist()
                t2 = time.perf_counter()
                for s, t in zip(states, toks):
                    assert s.advance(t)
                t3 = time.perf_counter()
                last = toks
                if step >= 5:
                    tf += t1 - t0; ta += t3 - t2; n += 1
            for p, a, _ in workers:
                a.send(None); p.join(10)
            del masks
            shm.close(); shm.unlink()
            r = {"rows": rows, "procs": procs, "fill_ms": round(tf / n * 1e3, 3), "fill_us_row": round(tf / n / rows * 1e6, 2),
                 "main_advance_ms": round(ta / n * 1e3, 3)}
            results.append(r)
            print(json.dumps(r), flush=True)
    json.dump(results, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
