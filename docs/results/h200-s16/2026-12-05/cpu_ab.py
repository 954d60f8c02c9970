"""CPU A/B: the default model, 16 greedy requests of 64 tokens at once, in process."""
import sys, time, anyio
import aserve
async def main():
    async with aserve.Engine() as e:
        p = aserve.SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
        await e.complete("warm up", aserve.SamplingParams(max_tokens=4, temperature=0))
        prompts = [f"Tell me a story about the number {i}." for i in range(16)]
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for q in prompts: tg.start_soon(e.complete, q, p)
        dt = time.perf_counter() - t0
        st = e.stats()
        print(f"{sys.argv[1]}: {16*64/dt:.0f} tok/s, host plan/launch/commit ms a step {st.host_plan_s/st.num_steps*1e3:.2f}/{st.host_launch_s/st.num_steps*1e3:.2f}/{st.host_commit_s/st.num_steps*1e3:.2f}")
anyio.run(main)
