#!/usr/bin/env python3
"""Times torch.optim.AdamW(fused=True) on 10M, 100M and 1B fp32 parameters with CUDA events and,
given bench_kernels' JSON output, prints zeroshard's fused AdamW step time over PyTorch's.

    ./bench_kernels --benchmark_filter=BM_FusedAdamW --benchmark_format=json > ours.json
    python3 compare_torch_adamw.py --ours ours.json
"""

import argparse
import json
import sys

SIZES = {"10M": 10_000_000, "100M": 100_000_000, "1B": 1_000_000_000}
# Read p, g, m, v and write p, m, v: the count bench_kernels uses for BM_FusedAdamW.
BYTES_PER_PARAM = 28


def our_throughputs(path):
    """GB/s of each BM_FusedAdamW/<size> in a Google Benchmark JSON file, by size label."""
    with open(path) as f:
        report = json.load(f)
    result = {}
    for entry in report["benchmarks"]:
        name = entry["name"]
        if not name.startswith("BM_FusedAdamW/") or entry.get("run_type") == "aggregate":
            continue
        if entry.get("error_occurred"):
            print(f"note: {name} did not run: {entry.get('error_message')}", file=sys.stderr)
            continue
        label = name.split("/")[1]
        result[label] = entry["bytes_per_second"] / 1e9
    return result


def torch_milliseconds(params, warmup, iterations):
    """Mean milliseconds of one fused AdamW step over `params` fp32 parameters."""
    import torch

    param = torch.nn.Parameter(torch.full((params,), 0.5, device="cuda"))
    param.grad = torch.full_like(param, 1e-3)
    optimizer = torch.optim.AdamW([param], lr=1e-3, weight_decay=1e-2, fused=True)
    for _ in range(warmup):  # the first step also allocates the state
        optimizer.step()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        optimizer.step()
    stop.record()
    stop.synchronize()
    milliseconds = start.elapsed_time(stop) / iterations
    del optimizer, param
    torch.cuda.empty_cache()
    return milliseconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ours", help="bench_kernels --benchmark_format=json output")
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()

    ours = our_throughputs(args.ours) if args.ours else {}
    # Under 1 in the last column: zeroshard's step is faster than PyTorch's.
    print(f"{'size':>5} {'torch ms':>10} {'torch GB/s':>11} {'ours ms':>10} {'ours GB/s':>10} "
          f"{'our time/theirs':>16}")
    for label in args.sizes:
        params = SIZES[label]
        milliseconds = torch_milliseconds(params, args.warmup, args.iterations)
        theirs = params * BYTES_PER_PARAM / (milliseconds / 1e3) / 1e9
        line = f"{label:>5} {milliseconds:>10.3f} {theirs:>11.1f}"
        if label in ours:
            our_milliseconds = params * BYTES_PER_PARAM / (ours[label] * 1e9) * 1e3
            line += (f" {our_milliseconds:>10.3f} {ours[label]:>10.1f}"
                     f" {our_milliseconds / milliseconds:>16.3f}")
        print(line)


if __name__ == "__main__":
    main()
