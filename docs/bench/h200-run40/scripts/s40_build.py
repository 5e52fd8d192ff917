"""Session 40: where a new launch plan's time goes (contiguous decode, cache growing by one key a call)."""
import cProfile, pstats, sys, time, io
import torch
sys.path.insert(0, "bench")
import decode
import attnfuse
fn = attnfuse.compile(decode.PROGRAM)
q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 8, 9000, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
for n in range(8192, 8202):
    fn(q, k[:, :, :n], v[:, :, :n])
torch.cuda.synchronize()
times = []
pr = cProfile.Profile()
for n in range(8202, 8262):
    t = time.perf_counter()
    pr.enable()
    fn(q, k[:, :, :n], v[:, :, :n])
    pr.disable()
    torch.cuda.synchronize()
    times.append((time.perf_counter() - t) * 1e6)
times.sort()
print("median us", times[len(times) // 2])
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(40)
print(s.getvalue())
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
print(s.getvalue())
