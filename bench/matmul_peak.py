"""The machine's measured matmul throughput: the denominator of the train step's MFU on a CPU (no vendor
peak to quote). fp32 GEMMs of square sizes at the bench's thread count; the best size's median TFLOP/s.

    OMP_NUM_THREADS=2 python bench/matmul_peak.py            # prints {"tflops": ..., "sizes": {...}} as JSON
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch

SIZES = (512, 1024, 2048, 3072)


def gemm_tflops(n: int, reps: int, dtype=torch.float32) -> float:
    """Median TFLOP/s of `reps` n×n @ n×n products (2 n³ FLOPs each), after two warm-up products."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(2):
        a @ b
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * n ** 3 / statistics.median(times) / 1e12


def measure(sizes=SIZES, reps: int = 7, warm_s: float = 1.0) -> dict:
    """Each size's TFLOP/s after a second of GEMMs (measured cold, the first sizes read up to 10× low:
    the thread pool and the clock were still waking)."""
    a = torch.randn(1024, 1024)
    start = time.perf_counter()
    while time.perf_counter() - start < warm_s:
        a @ a
    found = {str(n): gemm_tflops(n, reps) for n in sizes}
    return {"tflops": max(found.values()), "sizes": found, "threads": torch.get_num_threads(), "dtype": "float32"}


if __name__ == "__main__":
    json.dump(measure(), sys.stdout)
    print()
