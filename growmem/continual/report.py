"""Aggregating runs over seeds, the results table, and the plots of a continual run."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from growmem.reporting import compare, mean_std

#: summary keys aggregated over seeds (mean and std)
SUMMARY_KEYS = ("acc_mean_over_experiences", "acc_stream_weighted", "forgetting", "bwt", "acc_current_mean",
                "prequential_acc_mean", "bytes_in_use_peak", "bytes_in_use_final", "bytes_allocated_peak",
                "bytes_allocated_final", "train_seconds", "eval_seconds", "wall_seconds")


def aggregate(runs: Sequence[dict]) -> Dict[str, Dict[str, dict]]:
    """``{method: {key: {"mean", "std", "n", "values"}}}`` over the seeds of each method (``std``: the sample
    standard deviation, ``n == 1``: one seed, no spread measured)."""
    out: Dict[str, Dict[str, dict]] = {}
    for method in dict.fromkeys(r["method"] for r in runs):
        rs = [r for r in runs if r["method"] == method]
        agg = {}
        for key in SUMMARY_KEYS:
            vals = [r["summary"].get(key) for r in rs]
            vals = [float(v) for v in vals if v is not None and math.isfinite(float(v))]
            if vals:
                agg[key] = mean_std(vals)
        within = [r["summary"].get("within_budget") for r in rs]
        if any(w is not None for w in within):
            agg["within_budget"] = all(bool(w) for w in within if w is not None)
        agg["seeds"] = [r["seed"] for r in rs]
        out[method] = agg
    return out


def verdicts(summary: Dict[str, dict], reference: str, key: str = "acc_mean_over_experiences") -> Dict[str, str]:
    """``{method: "better" | "worse" | "tie" | "untested"}`` of each method against ``reference`` on ``key``
    (:func:`growmem.reporting.compare`: by a Student t-test at 95 %, else a tie; paired by
    seed when both ran the same seeds — the same stream and class order for both)."""
    ref, ref_seeds = summary[reference][key]["values"], summary[reference]["seeds"]
    out = {}
    for m, agg in summary.items():
        if m == reference or key not in agg:
            continue
        paired = agg["seeds"] == ref_seeds and len(agg[key]["values"]) == len(ref)
        out[m] = compare(agg[key]["values"], ref, paired=paired)
    return out


def _fmt(agg: dict, key: str, scale: float = 1.0, digits: int = 3, unit: str = "") -> str:
    if key not in agg:
        return "-"
    m, s = agg[key]["mean"] * scale, agg[key]["std"] * scale
    if len(agg[key]["values"]) > 1:
        return f"{m:.{digits}f}±{s:.{digits}f}{unit}"
    return f"{m:.{digits}f}{unit}"


def format_bytes(n: Optional[float]) -> str:
    if n is None:
        return "-"
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= f:
            return f"{n / f:.2f} {unit}"
    return f"{n:.0f} B"


def table(summary: Dict[str, dict], drift: bool = False) -> str:
    """The results table (mean ± std over seeds)."""
    cols = [("method", None), ("acc_mean_over_exps", "acc_mean_over_experiences"),
            ("acc_stream_weighted", "acc_stream_weighted"), ("forgetting", "forgetting"), ("bwt", "bwt")]
    if drift:
        cols += [("acc_current", "acc_current_mean"), ("prequential", "prequential_acc_mean")]
    cols += [("bytes_in_use_peak", "bytes_in_use_peak"), ("bytes_alloc_peak", "bytes_allocated_peak"),
             ("wall_s", "wall_seconds")]
    rows = []
    for method, agg in summary.items():
        row = [method]
        for _, key in cols[1:]:
            if key.startswith("bytes"):
                row.append(format_bytes(agg[key]["mean"]) if key in agg else "-")
            elif key == "wall_seconds":
                row.append(_fmt(agg, key, digits=1))
            else:
                row.append(_fmt(agg, key))
        if agg.get("within_budget") is False:
            row[0] += " (over budget)"
        rows.append(row)
    header = [c for c, _ in cols]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda r: "  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(r, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def mean_matrix(runs: Sequence[dict]) -> np.ndarray:
    mats = [np.asarray([[np.nan if v is None else v for v in row] for row in r["accuracy_matrix"]], float)
            for r in runs]
    return np.nanmean(np.stack(mats), axis=0) if len(mats) > 1 else mats[0]


def plot(doc: dict, out_dir, name: str = "continual") -> List[Path]:
    """``<name>_accuracy_matrix.png`` (heat-map per method, mean over seeds) and
    ``<name>_stream.png`` (accuracy on the experiences seen so far, and bytes in use, after
    each experience)."""
    from growmem.reporting import pyplot, save_figure

    plt = pyplot()
    out_dir = Path(out_dir)
    runs = doc["runs"]
    methods = list(dict.fromkeys(r["method"] for r in runs))
    paths = []
    n = len(methods)
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols + 1.0, 3.2 * rows + 0.6), squeeze=False,
                             layout="constrained")
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    for ax, m in zip(axes.ravel(), methods):
        a = mean_matrix([r for r in runs if r["method"] == m])
        im = ax.imshow(a, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_title(m, fontsize=9)
        ax.set_xlabel("test experience j", fontsize=8)
        ax.set_ylabel("after training i", fontsize=8)
        if a.shape[0] == 1:
            ax.set_yticks([0], ["end"])
        if a.size <= 100:
            for (i, j), v in np.ndenumerate(a):
                if np.isfinite(v):
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6,
                            color="white" if v < 0.5 else "black")
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="accuracy a[i][j]")
    fig.suptitle(f"accuracy matrix — {doc['stream']['name']} (mean over seeds)")
    paths.append(save_figure(fig, out_dir / f"{name}_accuracy_matrix.png"))
    plt.close(fig)

    fig, (a1, a3, a2) = plt.subplots(1, 3, figsize=(15, 4), layout="constrained")
    for k, m in enumerate(methods):
        rs = [r for r in runs if r["method"] == m]
        a = mean_matrix(rs)
        color = f"C{k % 10}"
        if a.shape[0] == a.shape[1] and a.shape[0] > 1:
            seen = [np.nanmean(a[i, :i + 1]) for i in range(a.shape[0])]
            a1.plot(range(1, len(seen) + 1), seen, marker="o", label=m, color=color)
            a3.plot(range(1, len(seen) + 1), np.diag(a), marker="o", label=m, color=color)
        else:
            a1.axhline(np.nanmean(a[-1]), ls=":", label=f"{m} (end)", color=color)
        b = np.mean([[rec["final_in_use"] for rec in r["bytes"]] for r in rs], axis=0)
        if len(b) > 1:
            a2.plot(range(1, len(b) + 1), b, marker="o", label=m, color=color)
        else:
            a2.axhline(b[0], ls=":", label=f"{m} (end)", color=color)
    a1.set_xlabel("experiences trained")
    a1.set_ylabel("mean accuracy on the experiences seen")
    a1.set_ylim(0, 1)
    a1.legend(fontsize=7)
    a3.set_xlabel("experiences trained i")
    a3.set_ylabel("accuracy on the current experience a[i][i]")
    a3.set_ylim(0, 1)
    a2.set_xlabel("experiences trained")
    a2.set_ylabel("bytes in use (end of experience)")
    a2.set_yscale("log")
    if doc.get("budget_bytes"):
        a2.axhline(doc["budget_bytes"], color="k", lw=0.8, ls="--", label="budget")
    a2.legend(fontsize=7)
    fig.suptitle(f"{doc['stream']['name']}: accuracy and memory over the stream")
    paths.append(save_figure(fig, out_dir / f"{name}_stream.png"))
    plt.close(fig)
    return paths
