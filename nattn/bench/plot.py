"""--plot: one group of bars per problem, each row's time over the problem's floor (log scale)."""

from __future__ import annotations

from typing import List


def plot(results: List[dict], path: str, backprop: bool) -> str:
    """Write the chart; returns a message (matplotlib is an optional dependency)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "--plot needs matplotlib (pip install 'nattn[bench]'); no chart written"
    done = [r for r in results if not r.get("skipped")]
    if not done:
        return "nothing measured; no chart written"
    key = "fwd_bwd_ms" if backprop else "fwd_ms"
    floor_key = "fwd_bwd" if backprop else "fwd"
    names = []
    for r in done:
        names += [row["name"] for row in r["rows"] if row["name"] not in names]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(done)), 4.5))
    width = 0.8 / (len(names) + 1)
    for j, name in enumerate(names):
        xs, ys = [], []
        for i, r in enumerate(done):
            row = next((x for x in r["rows"] if x["name"] == name), None)
            if row and row.get(key):
                xs.append(i + j * width)
                ys.append(row[key])
        ax.bar(xs, ys, width, label=name)
    floors = [r["floors"][floor_key]["floor_ms"] for r in done]
    ax.bar([i + len(names) * width for i in range(len(done))], floors, width, label="floor", color="black")
    ax.set_xticks([i + 0.4 for i in range(len(done))])
    ax.set_xticklabels([r["name"] for r in done], rotation=20, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel(("forward+backward" if backprop else "forward") + " time (ms, log)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"chart written to {path}"
