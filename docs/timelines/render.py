#!/usr/bin/env python3
"""Renders the Chrome traces that docs_timelines writes (cg::to_chrome_trace) into the PNG
pictures of docs/scheduling.md: for each pass, the "before" timeline above the "after" one, each
with its compute and communication streams, exposed waits in red.

    python3 docs/timelines/render.py <dir with NAME.before.json and NAME.after.json> <out dir>

Needs matplotlib (scripts/docs.sh installs it in a virtual environment).
"""
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"compute": "#4C72B0", "wait": "#8C8C8C", "comm": "#55A868", "stall": "#C44E52"}


def load(path):
    """(title, slices) of one trace: slices are (lane, start_us, dur_us, category, label)."""
    events = json.loads(path.read_text())["traceEvents"]
    title = next(e["args"]["name"] for e in events if e.get("name") == "process_name")
    slices = []
    for e in events:
        if e.get("ph") != "X":
            continue
        label = e["name"].split(" ")[0].lstrip("%") if e["cat"] != "stall" else "exposed"
        slices.append((e["tid"], e["ts"], e["dur"], e["cat"], label))
    return title, slices


def draw(ax, title, slices, xmax):
    end = max((s + d for _, s, d, _, _ in slices), default=0.0)
    comm = sum(d for lane, _, d, _, _ in slices if lane == 1)
    exposed = sum(d for _, _, d, cat, _ in slices if cat == "stall")
    for lane, start, dur, cat, label in slices:
        y = 1 - lane  # compute on top, communication below
        if dur <= 0:
            continue
        ax.broken_barh([(start, dur)], (y - 0.35, 0.7), facecolors=COLORS[cat], edgecolor="white", linewidth=0.8)
        label = fit(label, dur, xmax)
        if label:
            ax.text(start + dur / 2, y, label, ha="center", va="center", fontsize=7, color="white", clip_on=True)
    ax.set_yticks([1, 0], ["compute", "comm"])
    ax.set_xlim(0, xmax)
    ax.set_ylim(-0.6, 1.6)
    ax.set_title(f"{title}    total {fmt(end)}, exposed communication {fmt(exposed)} of {fmt(comm)}",
                 fontsize=9, loc="left")
    ax.grid(axis="x", alpha=0.3)


def fit(label, dur, xmax):
    """The label, abbreviated if it does not fit in a slice of `dur` on an axis of `xmax`; or ""."""
    per_char = 0.0068 * xmax  # about 7-point characters on a 10-inch axis
    for text in (label, label.replace("all_reduce", "ar").replace("_coalesced", "_co").replace("matmul", "mm")):
        if (len(text) + 1) * per_char < dur:
            return text
    return ""


def fmt(us):
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} us"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for before in sorted(src.glob("*.before.json")):
        name = before.name[: -len(".before.json")]
        after = src / f"{name}.after.json"
        traces = [load(before), load(after)]
        xmax = 1.02 * max(s + d for _, sl in traces for _, s, d, _, _ in sl)
        fig, axes = plt.subplots(2, 1, figsize=(10, 2.6), sharex=True)
        for ax, (title, slices) in zip(axes, traces):
            draw(ax, title.removeprefix(name + " "), slices, xmax)
        axes[-1].set_xlabel("predicted time (us)")
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=110)
        plt.close(fig)
        print(out / f"{name}.png")


if __name__ == "__main__":
    main()
