#!/usr/bin/env python3
"""PyTorch's numbers for bench_gpu_norms' workloads, on one GPU, in the same format:

    RESULT <workload> torch_eager <us> us

so bench/compare_table.py can merge both (bench/compare_norms.sh runs the pair). Lines starting
with '#' are comments (versions, device, errors).

Workloads (names as bench_gpu_norms prints them; <t> is f32 or bf16, <m>x<n> the shape):
  softmax_<t>_<m>x<n>, log_softmax_..., softmax_backward_...   torch.softmax / log_softmax along
                                                                the last dim; aten._softmax_backward_data
  layer_norm_..., layer_norm_backward_...                       F.layer_norm with weight and bias;
                                                                aten.native_layer_norm_backward
  rms_norm_..., rms_norm_backward_...                           F.rms_norm with weight; its backward
                                                                through autograd.grad (the graph built once)
  sum_lastdim_, sum_dim0_, amax_lastdim_, argmax_lastdim_, var_lastdim_, var_dim0_, sum_all_
  cross_entropy_<t>_<tokens>x<vocab>, cross_entropy_backward_   F.cross_entropy (mean); its backward
                                                                through autograd.grad

Timing: CUDA events around each call after warm-up, median; random inputs rotated through enough
copies that they never sit in L2 between calls (as bench_gpu_norms). Each workload is wrapped in
try/except: a failure prints `RESULT <workload> torch_eager nan us` and a `# error:` line.

Usage: python3 bench/torch_norms.py [--quick] [--only SUBSTR]
"""

import argparse
import statistics
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError as exc:  # pragma: no cover - reported, not raised
    print(f"# error: cannot import torch: {exc}")
    sys.exit(1)

L2_BYTES = 50e6


def copies_for(nbytes):
    return max(1, min(8, int(2 * L2_BYTES / max(nbytes, 1.0)) + 1))


def time_us(fn, copies, warmup, iters):
    for i in range(warmup):
        fn(i % copies)
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    ev[0].record()
    for i in range(iters):
        fn(i % copies)
        ev[i + 1].record()
    torch.cuda.synchronize()
    return statistics.median(1e3 * ev[i].elapsed_time(ev[i + 1]) for i in range(iters))


class Bench:
    def __init__(self, args):
        self.args = args

    def wanted(self, w):
        return not self.args.only or self.args.only in w

    def report(self, workload, fn, copies):
        if not self.wanted(workload):
            return
        try:
            us = time_us(fn, copies, 3 if self.args.quick else 10, 20 if self.args.quick else 100)
            print(f"RESULT {workload} torch_eager {us:.4f} us", flush=True)
        except Exception as exc:  # noqa: BLE001 - every failure is reported, the run goes on
            print(f"# error: {workload} torch_eager: {type(exc).__name__}: {exc}".replace("\n", " ")[:400], flush=True)
            print(f"RESULT {workload} torch_eager nan us", flush=True)


def rand(shape, dtype, lo=-2.0, hi=2.0):
    return (torch.rand(shape, device="cuda", dtype=torch.float32) * (hi - lo) + lo).to(dtype)


def tname(dtype):
    return {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}[dtype]


def rowwise(b, dtype, m, n):
    shape = f"{tname(dtype)}_{m}x{n}"
    nbytes = m * n * torch.tensor([], dtype=dtype).element_size()
    copies = copies_for(nbytes)
    x = [rand((m, n), dtype) for _ in range(copies)]
    g = [rand((m, n), dtype) for _ in range(copies)]
    w, bias = rand((n,), dtype), rand((n,), dtype)
    b.report(f"softmax_{shape}", lambda k: torch.softmax(x[k], -1), copies)
    b.report(f"log_softmax_{shape}", lambda k: torch.log_softmax(x[k], -1), copies)
    y = torch.softmax(x[0], -1)
    b.report(f"softmax_backward_{shape}",
             lambda k: torch.ops.aten._softmax_backward_data(g[k], y, -1, dtype), copies)
    b.report(f"layer_norm_{shape}", lambda k: F.layer_norm(x[k], (n,), w, bias, 1e-5), copies)
    b.report(f"rms_norm_{shape}", lambda k: F.rms_norm(x[k], (n,), w), copies)
    if b.wanted(f"layer_norm_backward_{shape}"):
        _, mean, rstd = torch.ops.aten.native_layer_norm(x[0], (n,), w, bias, 1e-5)
        b.report(f"layer_norm_backward_{shape}",
                 lambda k: torch.ops.aten.native_layer_norm_backward(g[k], x[0], (n,), mean, rstd, w, bias,
                                                                     [True, True, True]), copies)
    if b.wanted(f"rms_norm_backward_{shape}"):
        xr = x[0].detach().requires_grad_(True)
        wr = w.detach().requires_grad_(True)
        yr = F.rms_norm(xr, (n,), wr)
        b.report(f"rms_norm_backward_{shape}",
                 lambda k: torch.autograd.grad(yr, (xr, wr), g[k], retain_graph=True), copies)


def reductions(b, dtype, m, n):
    shape = f"{tname(dtype)}_{m}x{n}"
    nbytes = m * n * torch.tensor([], dtype=dtype).element_size()
    copies = copies_for(nbytes)
    x = [rand((m, n), dtype) for _ in range(copies)]
    b.report(f"sum_lastdim_{shape}", lambda k: x[k].sum(-1), copies)
    b.report(f"sum_dim0_{shape}", lambda k: x[k].sum(0), copies)
    b.report(f"amax_lastdim_{shape}", lambda k: x[k].amax(-1), copies)
    b.report(f"argmax_lastdim_{shape}", lambda k: x[k].argmax(-1), copies)
    b.report(f"var_lastdim_{shape}", lambda k: x[k].var(-1), copies)
    b.report(f"var_dim0_{shape}", lambda k: x[k].var(0), copies)
    b.report(f"sum_all_{shape}", lambda k: x[k].sum(), copies)


def cross_entropy(b, dtype, tokens, vocab):
    shape = f"{tname(dtype)}_{tokens}x{vocab}"
    nbytes = tokens * vocab * torch.tensor([], dtype=dtype).element_size()
    copies = copies_for(nbytes)
    x = [rand((tokens, vocab), dtype, -4.0, 4.0) for _ in range(copies)]
    t = torch.randint(0, vocab, (tokens,), device="cuda")
    b.report(f"cross_entropy_{shape}", lambda k: F.cross_entropy(x[k], t), copies)
    if b.wanted(f"cross_entropy_backward_{shape}"):
        xr = [xi.detach().requires_grad_(True) for xi in x]
        losses = [F.cross_entropy(xi, t) for xi in xr]
        b.report(f"cross_entropy_backward_{shape}",
                 lambda k: torch.autograd.grad(losses[k], xr[k], retain_graph=True), copies)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", default="")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("# error: no CUDA device for torch")
        return 1
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name(0)}, eager")
    b = Bench(args)
    # Inputs never require grad, so the forward workloads build no graph; the backward ones make
    # their own leaves.
    for m, n in ((8192, 4096), (4096, 8192), (32 * 4096, 128)):
        rowwise(b, torch.float32, m, n)
        rowwise(b, torch.bfloat16, m, n)
    reductions(b, torch.float32, 8192, 4096)
    reductions(b, torch.bfloat16, 8192, 4096)
    cross_entropy(b, torch.bfloat16, 8192, 32000)
    cross_entropy(b, torch.bfloat16, 4096, 50257)
    cross_entropy(b, torch.float32, 4096, 32000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
