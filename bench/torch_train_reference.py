#!/usr/bin/env python3
"""PyTorch's side of bench_gpu_train (issue 15 item 6), to run in the same lease: the same
data-parallel MLP step (x[T, H] -> linear(w1[F, H]) -> gelu -> linear(w2[H, F]) -> mean(y^2),
bf16, backward, DDP's gradient all_reduce, fused AdamW lr 1e-4) with DDP eagerly and with
torch.compile, on min(2, GPUs) ranks (as bench_gpu_train). The step is the one of
../shared/bench/torch_train_anchor.py (PERF.md's anchor), its data-parallel part only.
Median of 10 steps after 4, CUDA events. Prints a table and RESULT lines.

Usage: python3 bench/torch_train_reference.py [--quick] [--profile]
  --quick     T = 2048, as bench_gpu_train --quick
  --profile   after timing, rank 0 prints each mode's kernels over 3 steps (torch.profiler's
              table by CUDA time), to read beside bench_gpu_train --timeline
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from torch_step_common import main, print_profile, print_results, timeit


class MLP(nn.Module):
    def __init__(self, h, f):
        super().__init__()
        self.w1 = nn.Linear(h, f, bias=False)
        self.w2 = nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


def worker(rank, world, t_rows, profile):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=rank, world_size=world)
    dev = torch.device("cuda", rank)
    h, f = 4096, 16384
    workload = f"dp_mlp_T{t_rows}_H{h}_F{f}"
    out = {}
    for mode in ("eager", "compile"):
        torch.manual_seed(0)
        m = MLP(h, f).to(dev, torch.bfloat16)
        ddp = nn.parallel.DistributedDataParallel(m, device_ids=[rank])
        fwd = torch.compile(ddp) if mode == "compile" else ddp
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
        x = torch.randn(t_rows, h, device=dev, dtype=torch.bfloat16)
        last = {}

        def step():
            opt.zero_grad(set_to_none=True)
            y = fwd(x)
            loss = (y.float() ** 2).mean()
            loss.backward()
            opt.step()
            last["loss"] = loss

        out[mode] = (timeit(step), float(last["loss"].item()))
        if profile:
            print_profile(step, f"torch DDP {mode}", rank)
        del m, ddp, fwd, opt
    if rank == 0:
        print_results(workload, world, out, "ddp_", "loss after 14 steps")
    dist.destroy_process_group()


if __name__ == "__main__":
    main("torch_train_reference.py", worker, lambda quick: 2048 if quick else 8192)
