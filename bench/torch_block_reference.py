#!/usr/bin/env python3
"""PyTorch's side of bench_gpu_block (issue 16 item 7), to run in the same lease: the GPT-style
block of examples/gpt_block.hpp (pre-norm, causal attention + GELU MLP, no biases in the linears,
bf16) with tensor parallelism + sequence parallelism laid out by torch.distributed.tensor.parallel's
parallelize_module with torchtitan's plan, forward + backward of sum(x2^2) / (B L D) over each
rank's tokens, on min(2, GPUs) ranks. Modes: eager, torch.compile, and torch.compile with async TP
(Inductor's micro-pipelined all_gather / reduce_scatter matmuls) when this PyTorch supports it.
Median of 10 steps after 4, CUDA events. Prints a table and RESULT lines.

With --fsdp, the same block under FSDP2 instead (torch.distributed.fsdp.fully_shard on the block,
one data-parallel mesh over the ranks, each rank B / world of the batch at the full sequence;
gradients reduce-scattered), eager and torch.compile: bench_gpu_block --fsdp's side.

Usage: python3 bench/torch_block_reference.py [--quick] [--profile] [--fsdp]
  --quick     B = 1 (B = 2 with --fsdp; as bench_gpu_block --quick)
  --profile   after timing, rank 0 prints each mode's kernels over 3 steps
  --fsdp      FSDP2 instead of TP + SP
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from torch_step_common import main, print_profile, print_results, timeit


class Attention(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.e = d // h
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, l, _ = x.shape
        # -1: this rank's heads once wq/wk/wv are column shards (torchtitan's way)
        q = self.wq(x).view(b, l, -1, self.e).transpose(1, 2)
        k = self.wk(x).view(b, l, -1, self.e).transpose(1, 2)
        v = self.wv(x).view(b, l, -1, self.e).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, l, -1))


class FeedForward(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.w1 = nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, d, h, f):
        super().__init__()
        self.attention_norm = nn.LayerNorm(d, eps=1e-5)
        self.attention = Attention(d, h)
        self.ffn_norm = nn.LayerNorm(d, eps=1e-5)
        self.feed_forward = FeedForward(d, f)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


def tp_plan():
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)
    gather = lambda: PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return {
        "attention_norm": SequenceParallel(),
        "attention": gather(),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": gather(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }


def worker(rank, world, batch, profile, fsdp=False):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29537", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("dp",) if fsdp else ("tp",))
    dev = torch.device("cuda", rank)
    b, l, d, h, f = batch, 2048, 4096, 32, 16384
    workload = f"gpt_block_fsdp{world}_B{b}_L{l}_D{d}_H{h}_F{f}" if fsdp else f"gpt_block_tp{world}_sp_B{b}_L{l}_D{d}_H{h}_F{f}"
    out = {}
    for mode in ("eager", "compile") if fsdp else ("eager", "compile", "compile_async_tp"):
        try:
            import torch._inductor.config as inductor_config
            torch._dynamo.reset()
            if mode == "compile_async_tp":
                from torch.distributed._symmetric_memory import enable_symm_mem_for_group
                enable_symm_mem_for_group(mesh.get_group().group_name)
                inductor_config._micro_pipeline_tp = True
            torch.manual_seed(0)
            m = Block(d, h, f).to(dev, torch.bfloat16)
            if fsdp:
                from torch.distributed.fsdp import fully_shard
                fully_shard(m, mesh=mesh)  # one unit: one all_gather and one reduce_scatter of every parameter
            else:
                parallelize_module(m, mesh, tp_plan())
            fwd = torch.compile(m) if mode.startswith("compile") else m
            torch.manual_seed(1 + rank)
            x = (torch.randn(b // world, l, d, device=dev, dtype=torch.bfloat16) if fsdp else
                 torch.randn(b, l // world, d, device=dev, dtype=torch.bfloat16))
            last = {}

            def step():
                for p in m.parameters():
                    p.grad = None
                y = fwd(x)
                loss = (y.float() ** 2).sum() / (b * l * d)  # (FSDP: this rank's term, as ccgraph's)
                loss.backward()
                last["loss"] = loss

            out[mode] = (timeit(step), float(last["loss"].item()))
            if profile:
                print_profile(step, f"torch {'FSDP' if fsdp else 'TP'} block {mode}", rank)
            del m, fwd
        except Exception as e:  # async TP needs symmetric memory support; report, do not hide
            if rank == 0:
                print(f"# torch {mode}: failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
        finally:
            try:
                inductor_config._micro_pipeline_tp = False
            except Exception:
                pass
    if rank == 0:
        print_results(workload, world, out, "", "loss term, rank 0")
    dist.destroy_process_group()


if __name__ == "__main__":
    main("torch_block_reference.py", worker, lambda quick, fsdp: (2 if fsdp else 1) if quick else 4, ("--fsdp",))
