"""The kernel benchmark's clocks and byte models: do_bench medians (wall clock in the CPU smoke run), CUDA-graph
replays, the copy roofline, the bytes each phase moves, and the repeats a row keeps."""

from __future__ import annotations

import statistics
import time


def bench_ms(fn, smoke: bool, grad_to_none=None, rep_ms: int = 100) -> float:
    """Median milliseconds of fn(): triton's do_bench on a GPU (over about rep_ms of runs, after a quarter of that
    in warm-up), one wall-clock run after a warm-up in smoke mode."""
    if not smoke:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=max(1, rep_ms // 4), rep=rep_ms, grad_to_none=grad_to_none,
                              return_mode="median"))
    fn()  # warm-up (compilation)
    for t in grad_to_none or ():
        t.grad = None
    t0 = time.perf_counter()  # one timed run: the smoke run's numbers mean nothing, its plumbing is what it checks
    fn()
    return (time.perf_counter() - t0) * 1e3


def graph_ms(fn, smoke: bool, rep_ms: int = 100) -> float:
    """Median milliseconds of fn captured once in a CUDA graph and replayed (warm-up on a side stream)."""
    import torch

    if smoke:
        raise RuntimeError("no CUDA graphs on the CPU")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.empty_cache()  # the warm-up's cached blocks: the graph's private pool needs as much again
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):  # the warm-up's stream
        fn()
    try:
        return bench_ms(graph.replay, smoke, rep_ms=rep_ms)
    finally:
        del graph
        torch.cuda.empty_cache()  # the graph's pool


def bf16_order(t):
    """bf16 values as integers in the order of the values, consecutive for neighbouring representable values (so
    a difference counts the steps between two values, across binade edges too; +0 and -0 are both 0)."""
    import torch

    bits = t.to(torch.bfloat16).view(torch.int16).to(torch.int32)
    return torch.where(bits < 0, -(bits & 0x7FFF), bits)


def copy_gbps(device: str, smoke: bool) -> float:
    """Bandwidth of a large device-to-device copy (read + write), the roofline of a streaming kernel."""
    import torch

    n = 2**16 if smoke else 2**29  # 1 GiB of bf16 per buffer: far beyond L2
    src = torch.randn(n, device=device).to(torch.bfloat16)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), smoke)
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9


def fwd_bytes(m: int, n: int, es: int = 2) -> int:
    return 2 * m * n * es + n * es + 4 * m


def bwd_bytes(m: int, n: int, es: int = 2) -> int:
    return 3 * m * n * es + 2 * n * es + 4 * m


def add_fwd_bytes(m: int, n: int, es: int = 2) -> int:
    """Fused add + norm forward: read x, residual, w; write y, h, rstd."""
    return 4 * m * n * es + n * es + 4 * m


def add_bwd_bytes(m: int, n: int, es: int = 2) -> int:
    """Fused add + norm backward: read dy, dh, h, w, rstd; write one gradient for x and residual, and dW."""
    return 4 * m * n * es + 2 * n * es + 4 * m




def with_repeat(row: dict | None, new: dict, phases: list[str]) -> dict:
    """``row`` with one more repeat of the same provider and shape: each phase keeps its times per repeat
    (``<phase>_repeats``) and reports their median, with GB/s and the fraction of copy scaled from it; a phase that
    failed in any repeat keeps that repeat's error (a FAIL cell) and its repeats so far."""
    if row is None:
        row = {**new}
        for p in phases:
            if new.get(f"{p}_ms") is not None:
                row[f"{p}_repeats"] = [new[f"{p}_ms"]]
        return row
    for p in phases:
        if new.get(f"{p}_error") or row.get(f"{p}_error"):
            row[f"{p}_error"] = row.get(f"{p}_error") or new[f"{p}_error"]
            for k in ("ms", "gbps", "frac"):
                row.pop(f"{p}_{k}", None)
            continue
        if new.get(f"{p}_ms") is None:
            continue
        times = row.setdefault(f"{p}_repeats", [])
        times.append(new[f"{p}_ms"])
        row[f"{p}_ms"] = statistics.median(times)
        for k in ("gbps", "frac"):  # bytes over time: scaled from this repeat's to the median time
            if new.get(f"{p}_{k}") is not None:
                row[f"{p}_{k}"] = new[f"{p}_{k}"] * new[f"{p}_ms"] / row[f"{p}_ms"]
    return row
