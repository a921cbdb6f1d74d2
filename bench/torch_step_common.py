"""What the PyTorch sides of the step benches (torch_train_reference.py, torch_block_reference.py)
share: the timing (CUDA events around one step, the median of 10 after 4, as the C++ benches'
step_timer.hpp), the optional kernel profile, the result table, and the command line."""
import sys

import torch


def timeit(step, iters=10, warm=4):
    """Median milliseconds of `iters` calls of `step` after `warm`, CUDA events."""
    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def print_profile(step, title, rank):
    """Rank 0 prints the kernels of 3 steps (torch.profiler's table by CUDA time)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    if rank == 0:
        print(f"\n### {title}: kernels of 3 steps, rank 0\n", flush=True)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70), flush=True)


def print_results(workload, world, out, prefix, loss_label):
    """The table and RESULT lines of `out` = {mode: (ms, loss)}."""
    print(f"# torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}, {world} x {torch.cuda.get_device_name(0)}")
    print(f"| workload | torch | ms/step | {loss_label} |\n|---|---|---|---|")
    for mode, (ms, loss) in out.items():
        print(f"| {workload} | {prefix}{mode} | {ms:.3f} | {loss:.6g} |")
    for mode, (ms, _) in out.items():
        print(f"RESULT {workload} torch_{prefix}{mode} {ms:.3f} ms", flush=True)


def main(script, worker, size_of, extra_flags=()):
    """The command line [--quick] [--profile] [--world N] plus `extra_flags` (anything else is an
    error), then `worker(rank, world, size, profile, *extra)` on N processes (default min(2,
    GPUs)), where size is size_of(quick, *extra) and each extra is whether its flag was given."""
    import torch.multiprocessing as mp
    args = sys.argv[1:]
    usage = f"usage: {script} " + " ".join(f"[{k}]" for k in ("--quick", "--profile", "--world N") + tuple(extra_flags))
    world = min(2, torch.cuda.device_count())
    if "--world" in args:
        i = args.index("--world")
        if i + 1 >= len(args) or not args[i + 1].isdigit() or int(args[i + 1]) < 1:
            sys.exit(f"{script}: --world needs a positive integer; {usage}")
        if int(args[i + 1]) > torch.cuda.device_count():
            sys.exit(f"{script}: --world {args[i + 1]} needs as many GPUs; {torch.cuda.device_count()} visible")
        world = int(args[i + 1])
        del args[i:i + 2]
    known = ("--quick", "--profile") + tuple(extra_flags)
    unknown = [a for a in args if a not in known]
    if unknown:
        sys.exit(f"{script}: unknown argument(s) {unknown}; {usage}")
    if world < 1:
        print(f"{script}: no GPU")
        sys.exit(0)
    extra = tuple(f in args for f in extra_flags)
    mp.spawn(worker, args=(world, size_of("--quick" in args, *extra), "--profile" in args) + extra, nprocs=world,
             join=True)
