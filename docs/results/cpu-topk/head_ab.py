import aserve, torch, time, anyio
async def main():
    async with aserve.Engine(model="gemma-3-270m", num_threads=2, warmup=False) as eng:
        m = eng.runner.model
        for rows in (1, 16):
            h = torch.randn(rows, m.config.hidden_size)
            with torch.inference_mode():
                for name, fn in [("logits", lambda: m.logits(h)), ("greedy", lambda: m.greedy(h)),
                                 ("cand64", lambda: m.candidates(h, 64)), ("cand128", lambda: m.candidates(h, 128))]:
                    for _ in range(3): fn()
                    ts = []
                    for _ in range(15):
                        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
                    ts.sort()
                    print(f"rows={rows} {name}: {ts[len(ts)//2]*1e3:.2f} ms")
anyio.run(main)
