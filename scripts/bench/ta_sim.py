# Fagin's threshold algorithm (TA) over 7 per-day lists sorted by value,
# top-100 of the 7-day sums: how many sorted accesses (entries read in
# descending order, over all lists) and random accesses (a candidate's other
# days) it needs before the 100th best sum >= the threshold, on the data of
# tests/bench_queries.rs (independent, about uniform values) and on a skewed
# (Zipf) one. The README's Benchmarks section says why the store keeps window
# totals instead. Usage: python3 scripts/bench/ta_sim.py [counters]
import random, heapq, sys
def ta(days, n, k=100):
    lists = [sorted(range(n), key=lambda c: -d[c]) for d in days]
    seen = set(); heap = []; sorted_acc = 0; depth = 0
    while True:
        thr = 0
        for li, d in zip(lists, days):
            c = li[depth]; sorted_acc += 1
            if c not in seen:
                seen.add(c)
                s = sum(dd[c] for dd in days)
                if len(heap) < k: heapq.heappush(heap, s)
                elif s > heap[0]: heapq.heapreplace(heap, s)
            thr += d[li[depth]]
        depth += 1
        if len(heap) == k and heap[0] >= thr: break
    return depth, sorted_acc, len(seen) * (len(days) - 1)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 300000
random.seed(1)
# The bench's data: independent per day, about uniform in 1..1024.
uni = [[random.randint(1, 1024) for _ in range(n)] for _ in range(7)]
print("uniform  depth %d sorted %d random %d" % ta(uni, n))
# Skewed: a counter's popularity is Zipf (s=1) by rank, each day Poisson-ish noise around it.
pop = [1e6 / (r + 1) for r in range(n)]
random.shuffle(pop)
zipf = [[max(0, int(p * random.uniform(0.5, 1.5))) for p in pop] for _ in range(7)]
print("zipf     depth %d sorted %d random %d" % ta(zipf, n))
