#!/usr/bin/env python3
"""PyTorch's numbers for bench_gpu_index's workloads, on one GPU, in the same format:

    RESULT <workload> <impl> <ms> ms

(and `# ...` comment lines with the rates), so bench/compare_table.py can merge both; run the
pair with bench/compare_index.sh. The workloads and their names are bench_gpu_index's:
bmm and linear (F.linear, plus bias + GELU through torch._addmm_activation, cuBLASLt's fused
epilogue, and as F.gelu(F.linear(...), approximate="tanh")), F.scaled_dot_product_attention
(flash backend; the backward through autograd), F.embedding and its backward
(aten.embedding_dense_backward), torch.gather and torch.scatter_add.

Timing: CUDA events around each call after warm-up, medians; random inputs.

Usage: python3 bench/torch_index.py [--quick] [--only SUBSTR]
"""

import argparse
import statistics
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError as exc:  # pragma: no cover
    print(f"# error: cannot import torch: {exc}")
    sys.exit(1)

PEAK_TFLOPS = 989.0
PEAK_GBS = 3350.0


def time_ms(fn, warmup, iters):
    for i in range(warmup):
        fn(i)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn(i)
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def report(workload, impl, ms, flops=0.0, nbytes=0.0):
    print(f"RESULT {workload} {impl} {ms:.4f} ms")
    if flops:
        rate = flops / (ms * 1e-3) / 1e12
        print(f"# {workload} {impl}: {ms:.3f} ms, {rate:.1f} TFLOP/s ({100 * rate / PEAK_TFLOPS:.1f}% of H100 peak)")
    else:
        rate = nbytes / (ms * 1e-3) / 1e9
        print(f"# {workload} {impl}: {ms:.3f} ms, {rate:.1f} GB/s ({100 * rate / PEAK_GBS:.1f}% of H100 peak)")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    dev = "cuda"
    bf = torch.bfloat16
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    n = lambda full: 10 if args.quick else full  # noqa: E731

    def wanted(w):
        return args.only in w

    def guarded(workload, impl, fn):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            print(f"RESULT {workload} {impl} nan ms")
            print(f"# error: {workload} {impl}: {type(exc).__name__}: {exc}".replace("\n", " "))

    def bmm(B, M, N, K):
        w = f"bmm_bf16_{B}x{M}x{N}x{K}"
        if not wanted(w):
            return
        a = torch.randn(B, M, K, device=dev, dtype=bf)
        b = torch.randn(B, K, N, device=dev, dtype=bf)
        report(w, "torch", time_ms(lambda i: torch.bmm(a, b), 5, n(30)), flops=2.0 * B * M * N * K)

    def linear(M, N, K, gelu, bias):
        w = f"linear_bf16_{M}x{N}x{K}" + ("_bias" if bias else "") + ("_gelu" if gelu else "")
        if not wanted(w):
            return
        x = torch.randn(M, K, device=dev, dtype=bf)
        wt = torch.randn(N, K, device=dev, dtype=bf)
        b = torch.randn(N, device=dev, dtype=bf) if bias else None
        flops = 2.0 * M * N * K
        if gelu:
            report(w, "torch_linear_then_gelu",
                   time_ms(lambda i: F.gelu(F.linear(x, wt, b), approximate="tanh"), 5, n(30)), flops=flops)
            if bias:
                guarded(w, "torch_addmm_activation", lambda: report(
                    w, "torch_addmm_activation",
                    time_ms(lambda i: torch._addmm_activation(b, x, wt.t(), use_gelu=True), 5, n(30)), flops=flops))
        else:
            report(w, "torch", time_ms(lambda i: F.linear(x, wt, b), 5, n(30)), flops=flops)

    def sdpa(B, H, L, E, causal, backward):
        tag = f"bf16_B{B}_H{H}_L{L}_E{E}" + ("_causal" if causal else "")
        w, wb = f"sdpa_fwd_{tag}", f"sdpa_bwd_{tag}"
        if not wanted(w) and not (backward and wanted(wb)):
            return
        q, k, v = (torch.randn(B, H, L, E, device=dev, dtype=bf) for _ in range(3))
        flops = 4.0 * B * H * L * L * E * (0.5 if causal else 1.0)
        if wanted(w):
            with torch.no_grad():
                report(w, "torch_sdpa",
                       time_ms(lambda i: F.scaled_dot_product_attention(q, k, v, is_causal=causal), 3, n(20)),
                       flops=flops)
                # FlashAttention-2 (PyTorch's flash backend, mma.sync like ccgraph's kernels);
                # torch_sdpa above is PyTorch's default choice (cuDNN's on Hopper).
                from torch.nn.attention import SDPBackend, sdpa_kernel
                def flash2():
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        report(w, "torch_flash2", time_ms(
                            lambda i: F.scaled_dot_product_attention(q, k, v, is_causal=causal), 3, n(20)),
                            flops=flops)
                guarded(w, "torch_flash2", flash2)
        if backward and wanted(wb):
            qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            go = torch.randn_like(out)

            def step(i):
                torch.autograd.grad(out, (qg, kg, vg), go, retain_graph=True)

            report(wb, "torch_sdpa", time_ms(step, 2, n(10)), flops=2.5 * flops)

            def flash2_bwd():
                from torch.nn.attention import SDPBackend, sdpa_kernel
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    out2 = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)

                def step2(i):
                    torch.autograd.grad(out2, (qg, kg, vg), go, retain_graph=True)

                report(wb, "torch_flash2", time_ms(step2, 2, n(10)), flops=2.5 * flops)
            guarded(wb, "torch_flash2", flash2_bwd)

    def copy(name, view):
        w = f"copy_bf16_{name}"
        if not wanted(w):
            return
        out = torch.empty(view.shape, device=dev, dtype=bf)
        report(w, "torch", time_ms(lambda i: out.copy_(view), 3, n(50)), nbytes=4.0 * view.numel())

    def embedding(V, D, N):
        w = f"embedding_bf16_V{V}_D{D}_N{N}"
        wb = f"embedding_bwd_bf16_V{V}_D{D}_N{N}"
        table = torch.randn(V, D, device=dev, dtype=bf)
        idx = [torch.randint(0, V, (N,), device=dev) for _ in range(2)]
        if wanted(w):
            report(w, "torch", time_ms(lambda i: F.embedding(idx[i % 2], table), 5, n(50)),
                   nbytes=2.0 * N * D * 2 + 8.0 * N)
        if wanted(wb):
            grad = torch.randn(N, D, device=dev, dtype=bf)
            report(wb, "torch",
                   time_ms(lambda i: torch.ops.aten.embedding_dense_backward(grad, idx[i % 2], V, -1, False), 3, n(20)),
                   nbytes=2.0 * N * D + 2.0 * V * D + 8.0 * N)

    def gather_scatter(R, C, Ci):
        wg = f"gather_f32_{R}x{C}_idx{Ci}"
        ws = f"scatter_add_f32_{R}x{C}_idx{Ci}"
        inp = torch.randn(R, C, device=dev)
        index = torch.randint(0, C, (R, Ci), device=dev)
        if wanted(wg):
            report(wg, "torch", time_ms(lambda i: torch.gather(inp, 1, index), 5, n(50)), nbytes=R * Ci * (8 + 4 + 4))
        if wanted(ws):
            src = torch.randn(R, Ci, device=dev)
            report(ws, "torch", time_ms(lambda i: torch.scatter_add(inp, 1, index, src), 5, n(50)),
                   nbytes=8.0 * R * C + R * Ci * (8 + 4 + 8))

    bmm(16, 2048, 2048, 2048)
    bmm(256, 1024, 1024, 128)
    linear(8192, 16384, 8192, True, True)
    linear(8192, 8192, 8192, False, True)
    linear(8192, 8192, 8192, False, False)
    for B in ([1, 4] if args.quick else [1, 2, 4, 8]):
        for causal in (False, True):
            sdpa(B, 32, 4096, 128, causal, B == 1)
    sdpa(4, 32, 4096, 64, True, False)
    sdpa(4, 16, 2048, 128, True, True)  # the TP block's attention on each of 2 ranks
    embedding(128256, 4096, 8192)
    embedding(32000, 4096, 16384)
    gather_scatter(8192, 4096, 1024)
    gather_scatter(4096, 32000, 64)
    copy("heads_transpose_4x2048x16x128", torch.randn(4, 2048, 16, 128, device=dev, dtype=bf).transpose(1, 2))
    copy("dim1_gather_relayout_2x4x1024x4096", torch.randn(2, 4, 1024, 4096, device=dev, dtype=bf).transpose(0, 1))
    copy("narrow_cols_8192x2048_of_4096", torch.randn(8192, 4096, device=dev, dtype=bf).narrow(1, 0, 2048))
    copy("transpose_2d_4096x4096", torch.randn(4096, 4096, device=dev, dtype=bf).t())


if __name__ == "__main__":
    main()
