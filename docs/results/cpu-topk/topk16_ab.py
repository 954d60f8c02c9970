import time, anyio, aserve, sys
async def main():
    async with aserve.Engine(model="gemma-3-270m", num_threads=2) as eng:
        p = aserve.SamplingParams(max_tokens=128, temperature=1.0, top_k=40, seed=3, ignore_eos=True)
        res = []
        for rep in range(3):
            made = []
            async def one(i):
                made.append(len((await eng.complete(f"Story {i}:", p)).outputs[0].token_ids))
            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for i in range(16): tg.start_soon(one, i)
            res.append(sum(made) / (time.perf_counter() - t0))
        print(sys.argv[1], " ".join(f"{r:.1f}" for r in res), flush=True)
anyio.run(main)
