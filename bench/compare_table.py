#!/usr/bin/env python3
"""Merge `RESULT <workload> <impl> <value> <unit>` lines into one markdown table.

Inputs: any number of files (`-` or none: stdin), e.g. the output of build/bench/bench_gpu
(impls raw_nccl, ccgraph_*) and of bench/torch_reference.py (impls torch_*). Other lines are
ignored, except that `# ...` comment lines are listed under the table (errors separately).

One row per workload, one column per impl present, then:
  best ccgraph        the best ccgraph_* impl of the row (max for GB/s, min for us / ms)
  ccgraph / raw_nccl  GB/s and us rows: best ccgraph / raw_nccl
A row may carry raw NCCL timed beside a variant, `raw_nccl_<tag>` for `ccgraph_*_<tag>` (the
host drifts within a run, so bench_gpu times each eager variant in turns with its own raw
loop): each such impl is then compared with its own raw, and the best is the best ratio.
  ccgraph / torch     us and ms rows: best ccgraph / best torch_*
  target              PERF.md's target for the row, or an open issue's for the training step
                      (dp_mlp_*: 1.15x DDP + compile) and the GPT block (gpt_block_*: 1.2x
                      torch.compile): met / MISSED (`-` without data)
For GB/s higher is better; for us and ms lower is better. Missing values print as `-`, values a
benchmark reported as failed (nan) as `nan`. A (workload, impl) seen twice keeps the last value.

Usage: python3 bench/compare_table.py [FILE...]
"""

import math
import re
import sys

# Row order: PERF.md's; workloads not listed follow in order of first appearance.
WORKLOAD_ORDER = [
    "allreduce_busbw_16MiB",
    "allreduce_busbw_128MiB",
    "allreduce_busbw_1GiB",
    "allreduce_4KiB_eager",
    "allreduce_4KiB_graph",
    "seed_overlap_4096",
    "seed_overlap_8192",
    "tp_mlp",
]

# Column order: these first (where present), then other impls by family, in order of appearance.
IMPL_ORDER = [
    "raw_nccl",
    "ccgraph_eager",
    "ccgraph_graph",
    "ccgraph_cudagraph",
    "torch_funcol",
    "torch_c10d",
    "torch_eager",
    "torch_compile",
    "torch_compile_reorder",
]

HIGHER_IS_BETTER = {"GB/s"}

# PERF.md's targets. kind "vs_raw": value(impl) / raw_nccl compared with bound; kind "absolute":
# value(impl) compared with bound in the row's unit. impl "best" = the best ccgraph_* impl.
TARGETS = {
    "allreduce_busbw_16MiB": {"kind": "vs_raw", "impl": "best", "op": ">=", "bound": 0.97},
    "allreduce_busbw_128MiB": {"kind": "vs_raw", "impl": "best", "op": ">=", "bound": 0.97},
    "allreduce_busbw_1GiB": {"kind": "vs_raw", "impl": "best", "op": ">=", "bound": 0.97},
    "allreduce_4KiB_eager": {"kind": "vs_raw", "impl": "ccgraph_eager", "op": "<=", "bound": 1.2},
    "allreduce_4KiB_graph": {"kind": "vs_raw", "impl": "ccgraph_cudagraph", "op": "<=", "bound": 1.1},
    "seed_overlap_4096": {"kind": "absolute", "impl": "best", "op": "<=", "bound": 0.70},
    "seed_overlap_8192": {"kind": "absolute", "impl": "best", "op": "<=", "bound": 4.6},
    "tp_mlp": {"kind": "absolute", "impl": "best", "op": "<=", "bound": 6.1},
}

# The open issues' targets for their workloads, by workload prefix (the names carry the shapes):
# kind "vs_torch": the best ccgraph_* impl at least `speedup` times faster than torch impl `torch`
# of the same run. Issue 15 item 6: the data-parallel step against DDP + torch.compile; issue 16
# item 7: the TP + SP block and the FSDP block against torch.compile.
PREFIX_TARGETS = [
    ("dp_mlp_", {"kind": "vs_torch", "torch": "torch_ddp_compile", "speedup": 1.15}),
    ("gpt_block_", {"kind": "vs_torch", "torch": "torch_compile", "speedup": 1.2}),
]


def target_of(workload):
    """PERF.md's target for `workload`, or the open issues' for its prefix, or None."""
    if workload in TARGETS:
        return TARGETS[workload]
    for prefix, t in PREFIX_TARGETS:
        if workload.startswith(prefix):
            return t
    return None


# Best PyTorch time PERF.md measured for the absolute targets (ms). Absolute times move between
# machines: target / this is the same target as a ratio to the best torch impl of this run.
PERF_TORCH_BEST_MS = {"seed_overlap_4096": 0.888, "seed_overlap_8192": 5.349, "tp_mlp": 7.233}

RESULT_RE = re.compile(r"^\s*RESULT\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$")


def parse(lines, source, data, units, order, notes, errors, dups):
    for line in lines:
        line = line.rstrip("\n")
        m = RESULT_RE.match(line)
        if m:
            workload, impl, text, unit = m.groups()
            try:
                value = float(text)
            except ValueError:
                value = float("nan")
            if workload not in units:
                units[workload] = unit
                order.append(workload)
            elif units[workload] != unit:
                errors.append(f"{source}: {workload} {impl} in {unit}, expected {units[workload]}; ignored")
                continue
            if (workload, impl) in data:
                dups.add((workload, impl))
            data[(workload, impl)] = value
        elif line.lstrip().startswith("#"):
            text = line.strip()
            if text.lstrip("# ").lower().startswith("error"):
                errors.append(f"{source}: {text}")
            elif text.strip("# "):
                notes.append(f"{source}: {text}")


def ok(v):
    return v is not None and not math.isnan(v)


def fmt(v):
    if v is None:
        return "-"
    if math.isnan(v):
        return "nan"
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
        return f"{v:.3e}"
    return f"{v:.4g}"


def fmt_ratio(r):
    return "-" if r is None else f"{r:.3f}"


def impl_columns(impls):
    def family(i):
        if i.startswith("raw_nccl"):
            return 0
        if i.startswith("ccgraph"):
            return 1
        if i.startswith("torch"):
            return 2
        return 3

    known = [i for i in IMPL_ORDER if i in impls]
    rest = [i for i in impls if i not in IMPL_ORDER]
    cols = sorted(known + rest, key=lambda i: (family(i), IMPL_ORDER.index(i) if i in IMPL_ORDER else len(IMPL_ORDER)))
    return cols  # sorted() is stable: unknown impls keep their order of appearance


def best(values, unit):
    good = [(v, i) for i, v in values if ok(v)]
    if not good:
        return None, None
    v, i = (max if unit in HIGHER_IS_BETTER else min)(good, key=lambda p: p[0])
    return v, i


def raw_for(impl, row):
    """The raw NCCL value `impl` compares with: raw_nccl_<tag> for ccgraph_*_<tag>, else raw_nccl."""
    for key, v in row.items():
        if key.startswith("raw_nccl_") and impl.endswith("_" + key[len("raw_nccl_"):]):
            return v
    return row.get("raw_nccl")


def best_cc_of(row, unit):
    """The best ccgraph impl of a row: by value, or by ratio to its own raw when the row has tagged raws."""
    cc = [(i, v) for i, v in row.items() if i.startswith("ccgraph")]
    if not any(i.startswith("raw_nccl_") for i in row) or unit not in ("GB/s", "us"):
        return best(cc, unit)
    ratios = [(i, v / raw_for(i, row)) for i, v in cc if ok(v) and ok(raw_for(i, row)) and raw_for(i, row) != 0]
    _, impl = best(ratios, unit)
    return (row[impl], impl) if impl else (None, None)


def check_target(workload, unit, row, best_cc, best_cc_impl, best_torch):
    t = target_of(workload)
    if t is None:
        return "-", None
    if t["kind"] == "vs_torch":
        ref = row.get(t["torch"])
        if not ok(best_cc) or not ok(ref) or best_cc <= 0:
            return "-", None
        speedup = ref / best_cc
        met = speedup >= t["speedup"]
        return ("met" if met else "MISSED") + f": {speedup:.3f}x faster than {t['torch']}, needs >= {t['speedup']}x", met
    impl = best_cc_impl if t["impl"] == "best" else t["impl"]
    value = best_cc if t["impl"] == "best" else row.get(t["impl"])
    if not ok(value):
        return "-", None
    if t["kind"] == "vs_raw":
        raw = raw_for(impl or "", row)
        if not ok(raw) or raw == 0:
            return "-", None
        measured = value / raw
        what = f"{measured:.3f}x raw, needs {t['op']} {t['bound']}x"
    else:
        measured = value
        what = f"{measured:.4g} {unit}, needs {t['op']} {t['bound']}"
    met = measured >= t["bound"] if t["op"] == ">=" else measured <= t["bound"]
    text = ("met" if met else "MISSED") + f": {what}"
    if t["kind"] == "absolute" and workload in PERF_TORCH_BEST_MS and ok(best_torch) and best_torch > 0:
        # The same target relative to PyTorch, for machines slower or faster than PERF.md's.
        rel_bound = t["bound"] / PERF_TORCH_BEST_MS[workload]
        text += f" (as a ratio to torch: {value / best_torch:.3f}, needs <= {rel_bound:.3f})"
    return text, met


def build_table(data, units, order):
    impls = []
    for _, impl in data:
        if impl not in impls:
            impls.append(impl)
    cols = impl_columns(impls)
    workloads = [w for w in WORKLOAD_ORDER if w in units] + [w for w in order if w not in WORKLOAD_ORDER]

    header = ["workload", "unit"] + cols + ["best ccgraph", "ccgraph / raw_nccl", "ccgraph / torch", "target"]
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---"] + ["---:"] * len(cols) + ["---"] * 4) + "|"]
    tally = {True: 0, False: 0, None: len([w for w in TARGETS if w not in workloads])}
    for w in workloads:
        unit = units[w]
        row = {i: data[(w, i)] for i in cols if (w, i) in data}
        best_cc, best_cc_impl = best_cc_of(row, unit)
        best_torch, _ = best([(i, v) for i, v in row.items() if i.startswith("torch")], unit)
        raw = raw_for(best_cc_impl or "", row)
        vs_raw = vs_torch = None
        if unit in ("GB/s", "us") and ok(best_cc) and ok(raw) and raw != 0:
            vs_raw = best_cc / raw
        if unit in ("us", "ms") and ok(best_cc) and ok(best_torch) and best_torch != 0:
            vs_torch = best_cc / best_torch
        target, met = check_target(w, unit, row, best_cc, best_cc_impl, best_torch)
        if target_of(w) is not None:
            tally[met] += 1
        cells = [w, unit] + [fmt(row.get(i)) for i in cols]
        cells += [best_cc_impl or "-", fmt_ratio(vs_raw), fmt_ratio(vs_torch), target]
        out.append("| " + " | ".join(cells) + " |")
    return out, tally


def main(argv):
    paths = argv[1:] or ["-"]
    data, units, order, notes, errors, dups = {}, {}, [], [], [], set()
    for path in paths:
        if path == "-":
            parse(sys.stdin, "stdin", data, units, order, notes, errors, dups)
            continue
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                parse(f, path, data, units, order, notes, errors, dups)
        except OSError as exc:
            errors.append(f"{path}: cannot read: {exc.strerror}")
    if not data:
        print("No RESULT lines found in: " + ", ".join(paths))
        for e in errors:
            print(f"- {e}")
        return 1

    table, tally = build_table(data, units, order)
    print("\n".join(table))
    print()
    print(
        "GB/s rows: higher is better; us and ms rows: lower is better. Ratios use the best ccgraph_* impl "
        "(and the best torch_* impl)."
    )
    print(
        f"Targets (PERF.md's, and the open issues' for the training step and the GPT block): {tally[True]} met, "
        f"{tally[False]} missed, {tally[None]} without data."
    )
    if dups:
        print("Reported more than once (last value kept): " + ", ".join(f"{w} {i}" for w, i in sorted(dups)))
    if notes:
        print("\nNotes:")
        for n in notes:
            print(f"- {n}")
    if errors:
        print("\nErrors:")
        for e in errors:
            print(f"- {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
