"""llama.cpp's half of ``cpu_bench``, in a process of its own: run by path, never imported.

    python aserve/bench/llama_peer.py MODEL.gguf THREADS NEW RUNS [TOP_K] < prompts.json

Importing the aserve package sets ``OMP_WAIT_POLICY=PASSIVE`` for torch's OpenMP threads,
and llama.cpp's OpenMP runtime reads the same variable when it loads: run in the benchmark's
process, llama.cpp ran with aserve's policy instead of its own default (its idle threads
spin), which on a 2-core VM cost it 35-45% of its single-stream speed (docs/benchmarks.md,
"llama.cpp's environment"). This file imports nothing of aserve, and ``cpu_bench`` starts it
with the environment the user started the benchmark with.

stdin: ``{"prompt": text, "long_prompts": [[ids], ...]}`` (the text tokenized by llama.cpp, BOS first); stdout, last line: one JSON object
(seconds for each of RUNS decodes of NEW - 1 tokens after the prompt, after a warm-up, and each
long prompt's time to its first token). TOP_K other than 0: the decodes sample (temperature 1,
that top-k, or with TOP_K < 0 none, and nothing else: llama.cpp's sampler chain on the step's
logits) instead of taking the argmax.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    model, threads, new, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    top_k = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    work = json.load(sys.stdin)
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    long_prompts = work["long_prompts"]
    n_batch = max(512, *(len(p) for p in long_prompts))  # llm.scores holds n_batch rows
    llm = Llama(model, n_ctx=2048, n_batch=n_batch, n_threads=threads, n_threads_batch=threads, verbose=False)

    def pick() -> int:
        if top_k:
            return int(llm.sample(top_k=max(top_k, 0), top_p=1.0, min_p=0.0, temp=1.0))
        return int(np.argmax(llm.scores[llm.n_tokens - 1]))

    def generate(ids: list[int], n: int) -> tuple[float, float]:
        """(seconds to the first token, seconds for the next n - 1)."""
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        tok = pick()
        t1 = time.perf_counter()
        for _ in range(n - 1):
            llm.eval([tok])
            tok = pick()
        return t1 - t0, time.perf_counter() - t1

    prompt = llm.tokenize(work["prompt"].encode(), add_bos=True)
    generate(prompt, 4)  # warm-up
    decode = [generate(prompt, new)[1] for _ in range(runs)]
    ttfts = [generate(ids, 1)[0] for ids in long_prompts]
    env = {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    print(json.dumps({"version": llama_cpp.__version__, "decode_s": decode, "ttft_s": ttfts, "env": env}))


if __name__ == "__main__":
    main()
