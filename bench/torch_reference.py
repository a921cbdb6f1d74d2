#!/usr/bin/env python3
"""PyTorch reference numbers for PERF.md's GPU workloads, on every GPU (or --world N of them).

Prints, from rank 0 only, one line per measurement:

    RESULT <workload> <impl> <value> <unit>

the format bench_gpu prints, so bench/compare_table.py can merge both (bench/compare_gpu.sh runs
the pair). Lines starting with '#' are comments (versions, device, errors, checks).

Workloads (see design/PERF.md):
  {allreduce,allgather,reducescatter,alltoall}_busbw_{1MiB,16MiB,128MiB,1GiB}
                                       GB/s  bf16, nccl-tests' busbw: bytes/time * 2(n-1)/n for
                                              all_reduce, * (n-1)/n for the others
                                              torch_funcol (out of place), torch_c10d
  allreduce_4KiB_eager                 us    f32, per op, loops of 1000 ops
  seed_overlap_{4096,8192}             ms    the seed overlap program, bf16 N x N per rank
                                              torch_eager, torch_compile[, torch_compile_reorder]
  tp_mlp                               ms    x[8192,8192] @ w1[H,4H/world] -> gelu -> @ w2 -> all_reduce
                                              torch_eager, torch_compile

Timing: CUDA events on the current stream after warm-up, median of per-iteration times (or of
batches of small ops); random inputs, two sets rotated. Every workload is wrapped in try/except:
a failure prints `RESULT <workload> <impl> nan <unit>` and a `# error:` line and the run goes on.

Usage: python3 bench/torch_reference.py [--quick] [--world N] [--only SUBSTR[,SUBSTR...]] [--timeout S] [--deadline S]
(the world is every visible GPU by default, as bench_gpu's)
Set TORCH_REFERENCE_TRACEBACK=1 for full tracebacks of failures.
"""

import argparse
import datetime
import os
import socket
import statistics
import sys
import time
import traceback

# Before torch / NCCL initialise anything: NVLink multicast off (see PERF.md).
os.environ["NCCL_NVLS_ENABLE"] = "0"

try:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    import torch.multiprocessing as mp
    import torch.nn.functional as F

    _IMPORT_ERROR = None
except ImportError as _exc:  # main() reports it
    _IMPORT_ERROR = _exc
try:
    import torch._dynamo  # noqa: F401 -- torch._dynamo.reset() below; torch.compile's own failure is per case
except Exception:  # noqa: BLE001
    pass

WORLD = 2  # set by main() (--world, default: every visible GPU) before the workers start
MiB = 1 << 20

# Set in each worker.
_GROUP = None
_RANK = 0
_ARGS = None


def emit(line):
    """Print one line from rank 0 only."""
    if _RANK == 0:
        print(line, flush=True)


def result(workload, impl, value, unit):
    try:
        v = float(value)
    except Exception:
        v = float("nan")
    text = "nan" if v != v else f"{v:.4f}"
    emit(f"RESULT {workload} {impl} {text} {unit}")


def error(workload, impl, exc):
    msg = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    if len(msg) > 400:
        msg = msg[:400] + "..."
    # Every rank says what went wrong (rank 1's failures would otherwise be invisible).
    print(f"# error: {workload} {impl} (rank {_RANK}): {msg}", flush=True)
    if os.environ.get("TORCH_REFERENCE_TRACEBACK"):
        traceback.print_exc()


def wanted(workload):
    if not _ARGS.only:
        return True
    return any(s and s in workload for s in _ARGS.only.split(","))


def sync_all():
    torch.cuda.synchronize()
    try:
        dist.barrier(device_ids=[torch.cuda.current_device()])
    except TypeError:
        dist.barrier()
    torch.cuda.synchronize()


def time_each_ms(step, warmup, iters):
    """Median milliseconds of step(i) on the current stream: an event after each iteration."""
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    ev[0].record()
    for i in range(iters):
        step(i)
        ev[i + 1].record()
    torch.cuda.synchronize()
    return statistics.median(ev[i].elapsed_time(ev[i + 1]) for i in range(iters))


def time_loop_us(op, nops, batches, warmup):
    """Median over `batches` of (event time of `nops` back-to-back op(i)) / nops, microseconds."""
    for i in range(warmup):
        op(i)
    torch.cuda.synchronize()
    per_op = []
    for _ in range(batches):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(nops):
            op(i)
        end.record()
        end.synchronize()
        per_op.append(start.elapsed_time(end) * 1e3 / nops)
    return statistics.median(per_op)


def uniform(shape, lo, hi, dtype):
    return torch.empty(shape, device="cuda", dtype=torch.float32).uniform_(lo, hi).to(dtype)


def busbw_gbs(nbytes, ms, all_reduce=True):
    """nccl-tests' bus bandwidth: nbytes / time x 2(n-1)/n (all_reduce) or x (n-1)/n (others)."""
    return nbytes / (ms * 1e-3) * (2.0 if all_reduce else 1.0) * (WORLD - 1) / WORLD / 1e9


def run_case(workload, impl, unit, fn):
    """Run fn() -> value; on failure print nan and the error. Always ends with a sync + barrier."""
    value = float("nan")
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001 -- one failure must not lose the rest
        error(workload, impl, exc)
    result(workload, impl, value, unit)
    try:
        sync_all()
    except Exception as exc:  # noqa: BLE001
        error(workload, impl + "/barrier", exc)
    torch.cuda.empty_cache()
    return value


# ------------------------------------------------------------------------------------------------
# Programs
# ------------------------------------------------------------------------------------------------


def seed_program(a):
    ar = funcol.all_reduce(a, "sum", _GROUP)
    g = a @ a
    c = torch.relu(a)
    d = c @ c
    f = d * c * ar
    fr = funcol.all_reduce(f, "sum", _GROUP)
    e = (d + ar + fr) @ g
    return e


def tp_mlp_program(x, w1, w2):
    h = F.gelu(x @ w1)  # exact (erf) gelu, F.gelu's default
    y = h @ w2
    return funcol.wait_tensor(funcol.all_reduce(y, "sum", _GROUP))


def fresh_compile(fn):
    try:
        torch._dynamo.reset()
    except Exception:  # noqa: BLE001
        pass
    return torch.compile(fn, dynamic=False)


REORDER_PASSES = ["sink_waits", "raise_comms", "reorder_compute_for_overlap"]


def reorder_patch():
    """An inductor config patch enabling the compute/comm reorder passes, or None if absent."""
    try:
        import torch._inductor.config as icfg

        if not hasattr(icfg, "reorder_for_compute_comm_overlap"):
            return None
        opts = {"reorder_for_compute_comm_overlap": True}
        if hasattr(icfg, "reorder_for_compute_comm_overlap_passes"):
            opts["reorder_for_compute_comm_overlap_passes"] = list(REORDER_PASSES)
        return icfg.patch(opts)
    except Exception as exc:  # noqa: BLE001
        emit(f"# note: reorder passes unavailable: {type(exc).__name__}: {exc}")
        return None


def check(label, out, ref):
    """Print ||out - ref|| / ||ref|| as a comment; a failing check never fails the timing."""
    if ref is None:
        return
    try:

        o = out.float()
        r = ref.float()
        err = (torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r)).item()
        emit(f"# check {label}: rel err vs torch_eager {err:.2e}")
    except Exception as exc:  # noqa: BLE001
        emit(f"# check {label}: failed: {type(exc).__name__}: {exc}")


# ------------------------------------------------------------------------------------------------
# Workloads
# ------------------------------------------------------------------------------------------------


def bench_busbw():
    """{allreduce,allgather,reducescatter,alltoall}_busbw_<size>: bf16, nccl-tests' sizes (the
    all_reduce buffer, all_gather's output, reduce_scatter's input, all_to_all's buffer) and
    busbw; functional collectives out of place and c10d's (all_reduce in place)."""
    sizes = [("1MiB", 1 * MiB, 50), ("16MiB", 16 * MiB, 50), ("128MiB", 128 * MiB, 30), ("1GiB", 1024 * MiB, 20)]
    for name, nbytes, iters in sizes:
        if _ARGS.quick:
            iters = 5
        numel = nbytes // 2  # bf16
        shard = numel // WORLD

        def full():
            return [uniform((numel,), -1, 1, torch.bfloat16) for _ in range(2)]

        def part():
            return [uniform((shard,), -1, 1, torch.bfloat16) for _ in range(2)]

        def timed(make, step, all_reduce):
            xs = make()
            ms = time_each_ms(lambda i: step(xs[i % 2]), 5, iters)
            return busbw_gbs(shard * WORLD * 2, ms, all_reduce)

        out_full = lambda: torch.empty((numel,), device="cuda", dtype=torch.bfloat16)  # noqa: E731
        out_part = lambda: torch.empty((shard,), device="cuda", dtype=torch.bfloat16)  # noqa: E731
        cases = {
            "allreduce": (
                lambda: timed(full, lambda x: funcol.wait_tensor(funcol.all_reduce(x, "sum", _GROUP)), True),
                # In place: each op multiplies the values by WORLD (sum); two buffers, <= 28 ops
                # each: 4^28 = 2^56 and 8^28 = 2^84 stay inside bf16's range (2^127).
                lambda: timed(full, lambda x: dist.all_reduce(x, op=dist.ReduceOp.SUM), True),
            ),
            "allgather": (
                lambda: timed(part, lambda x: funcol.wait_tensor(funcol.all_gather_tensor(x, 0, _GROUP)), False),
                lambda: (lambda o: timed(part, lambda x: dist.all_gather_into_tensor(o, x), False))(out_full()),
            ),
            "reducescatter": (
                lambda: timed(full, lambda x: funcol.wait_tensor(funcol.reduce_scatter_tensor(x, "sum", 0, _GROUP)),
                              False),
                lambda: (lambda o: timed(full, lambda x: dist.reduce_scatter_tensor(o, x), False))(out_part()),
            ),
            "alltoall": (
                lambda: timed(full, lambda x: funcol.wait_tensor(funcol.all_to_all_single(x, None, None, _GROUP)),
                              False),
                lambda: (lambda o: timed(full, lambda x: dist.all_to_all_single(o, x), False))(out_full()),
            ),
        }
        for coll, (funcol_case, c10d_case) in cases.items():
            w = f"{coll}_busbw_{name}"
            if not wanted(w):
                continue
            run_case(w, "torch_funcol", "GB/s", funcol_case)
            run_case(w, "torch_c10d", "GB/s", c10d_case)


def bench_small_eager():
    w = "allreduce_4KiB_eager"
    if not wanted(w):
        return
    numel = 4096 // 4  # f32
    nops, batches = (200, 3) if _ARGS.quick else (1000, 5)

    def funcol_case():
        xs = [uniform((numel,), -1, 1, torch.float32) for _ in range(2)]
        return time_loop_us(
            lambda i: funcol.wait_tensor(funcol.all_reduce(xs[i % 2], "sum", _GROUP)), nops, batches, 100
        )

    def c10d_case():
        # In place, as c10d is used: the values double every op and reach inf after ~128 ops;
        # NCCL's sum kernel takes the same time whatever the values (no NaN: both ranks hold the
        # same values after the first op).
        xs = [uniform((numel,), -1, 1, torch.float32) for _ in range(2)]
        return time_loop_us(lambda i: dist.all_reduce(xs[i % 2], op=dist.ReduceOp.SUM), nops, batches, 100)

    run_case(w, "torch_funcol", "us", funcol_case)
    run_case(w, "torch_c10d", "us", c10d_case)


def bench_seed_overlap():
    for n in (4096, 8192):
        w = f"seed_overlap_{n}"
        if not wanted(w):
            continue
        iters = 5 if _ARGS.quick else (40 if n == 4096 else 20)
        state = {}

        def make_inputs():
            if "xs" not in state:
                state["xs"] = [uniform((n, n), -1, 1, torch.bfloat16) for _ in range(2)]
                state["ref"] = None
            return state["xs"]

        def eager_case():
            xs = make_inputs()
            with torch.no_grad():
                state["ref"] = seed_program(xs[0]).float()
                return time_each_ms(lambda i: seed_program(xs[i % 2]), 3, iters)

        def compiled(label):
            xs = make_inputs()
            with torch.no_grad():
                fn = fresh_compile(seed_program)
                t0 = time.perf_counter()
                out = fn(xs[0])
                torch.cuda.synchronize()
                first = time.perf_counter() - t0
                emit(f"# {w} {label}: first call (compile) {first:.2f} s")
                check(f"{w} {label}", out, state.get("ref"))
                del out
                return time_each_ms(lambda i: fn(xs[i % 2]), 5, iters)

        def compile_case():
            return compiled("torch_compile")

        def reorder_case():
            patch = reorder_patch()
            if patch is None:
                raise RuntimeError("torch._inductor.config has no reorder_for_compute_comm_overlap")
            with patch:
                return compiled("torch_compile_reorder")

        run_case(w, "torch_eager", "ms", eager_case)
        run_case(w, "torch_compile", "ms", compile_case)
        has_reorder = False
        try:
            import torch._inductor.config as icfg

            has_reorder = hasattr(icfg, "reorder_for_compute_comm_overlap")
        except Exception:  # noqa: BLE001
            pass
        if has_reorder:
            run_case(w, "torch_compile_reorder", "ms", reorder_case)
        else:
            emit("# note: torch._inductor.config.reorder_for_compute_comm_overlap absent; no torch_compile_reorder")
        state.clear()
        try:
            torch._dynamo.reset()
        except Exception:  # noqa: BLE001
            pass
        sync_all()
        torch.cuda.empty_cache()


def bench_tp_mlp():
    w = "tp_mlp"
    if not wanted(w):
        return
    T = H = 8192
    Fh = 4 * H // WORLD
    iters = 5 if _ARGS.quick else 20
    state = {}

    def make_inputs():
        if "x" not in state:
            state["x"] = [uniform((T, H), -1, 1, torch.bfloat16) for _ in range(2)]
            state["w1"] = uniform((H, Fh), -0.02, 0.02, torch.bfloat16)
            state["w2"] = uniform((Fh, H), -0.02, 0.02, torch.bfloat16)
            state["ref"] = None
        return state["x"], state["w1"], state["w2"]

    def eager_case():
        xs, w1, w2 = make_inputs()
        with torch.no_grad():
            state["ref"] = tp_mlp_program(xs[0], w1, w2).float()
            return time_each_ms(lambda i: tp_mlp_program(xs[i % 2], w1, w2), 3, iters)

    def compile_case():
        xs, w1, w2 = make_inputs()
        with torch.no_grad():
            fn = fresh_compile(tp_mlp_program)
            t0 = time.perf_counter()
            out = fn(xs[0], w1, w2)
            torch.cuda.synchronize()
            emit(f"# {w} torch_compile: first call (compile) {time.perf_counter() - t0:.2f} s")
            check(f"{w} torch_compile", out, state.get("ref"))
            del out
            return time_each_ms(lambda i: fn(xs[i % 2], w1, w2), 3, iters)

    run_case(w, "torch_eager", "ms", eager_case)
    run_case(w, "torch_compile", "ms", compile_case)
    state.clear()
    try:
        torch._dynamo.reset()
    except Exception:  # noqa: BLE001
        pass


# ------------------------------------------------------------------------------------------------
# Processes
# ------------------------------------------------------------------------------------------------


def worker(rank, args):
    global _GROUP, _RANK, _ARGS, WORLD
    _RANK, _ARGS = rank, args
    WORLD = args.world  # spawned workers start a fresh interpreter: main()'s global is not theirs

    torch.cuda.set_device(rank)
    timeout = datetime.timedelta(seconds=args.timeout)
    try:
        dist.init_process_group(
            "nccl", rank=rank, world_size=WORLD, timeout=timeout, device_id=torch.device("cuda", rank)
        )
    except TypeError:  # no device_id argument in this torch
        dist.init_process_group("nccl", rank=rank, world_size=WORLD, timeout=timeout)
    _GROUP = dist.group.WORLD
    torch.manual_seed(1234 + rank)

    if rank == 0:
        nccl = "?"
        try:
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001
            pass
        emit(f"# torch_reference.py on {datetime.datetime.now().isoformat(timespec='seconds')}")
        emit(f"# torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}, python {sys.version.split()[0]}")
        for d in range(torch.cuda.device_count()):
            emit(f"# GPU {d}: {torch.cuda.get_device_name(d)}")
        emit(f"# world {WORLD}, NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}, quick={args.quick}")
    sync_all()

    t0 = time.perf_counter()
    for section in (bench_busbw, bench_small_eager, bench_seed_overlap, bench_tp_mlp):
        try:
            section()
        except Exception as exc:  # noqa: BLE001 -- setup outside run_case failed
            error(section.__name__, "-", exc)
        try:
            sync_all()
        except Exception as exc:  # noqa: BLE001
            error(section.__name__, "barrier", exc)
    emit(f"# torch_reference.py done in {time.perf_counter() - t0:.1f} s")
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="few iterations (smoke test)")
    p.add_argument("--only", default="", help="comma-separated substrings of workload names to run")
    p.add_argument("--timeout", type=int, default=300, help="NCCL collective timeout, seconds")
    p.add_argument("--deadline", type=int, default=600, help="kill the workers after this many seconds")
    p.add_argument("--world", type=int, default=0, help="ranks, one per GPU (default: every visible GPU, as bench_gpu)")
    args = p.parse_args()

    global WORLD
    if _IMPORT_ERROR is not None:
        print(f"# error: torch not importable: {_IMPORT_ERROR}", flush=True)
        return 2
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.world == 0:
        args.world = n
    if args.world < 1 or n < args.world:
        print(f"# error: --world {args.world} needs as many CUDA devices, found {n}", flush=True)
        return 2
    WORLD = args.world

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    ctx = mp.spawn(worker, args=(args,), nprocs=WORLD, join=False)
    deadline = time.monotonic() + args.deadline
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                print(f"# error: workers still running after {args.deadline} s; killing them", flush=True)
                for proc in ctx.processes:
                    if proc.is_alive():
                        proc.terminate()
                return 1
    except Exception as exc:  # noqa: BLE001 -- a worker died
        print(f"# error: worker failed: {type(exc).__name__}: {str(exc).strip()[-2000:]}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
