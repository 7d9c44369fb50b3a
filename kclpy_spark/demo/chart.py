"""Lag per shard over a run, drawn in the terminal (one sparkline per shard) and, when matplotlib
is installed, as a PNG. The sparkline is pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None], width: int = 60) -> str:
    """``values`` scaled to eight bar heights (the maximum is the full bar), resampled to at most
    ``width`` characters (the highest value of each slice); a gap where a slice has none."""
    if not values:
        return ""
    slices: list[Sequence[float | None]] = []
    step = max(1, -(-len(values) // width))  # ceil
    for i in range(0, len(values), step):
        slices.append(values[i : i + step])
    peaks = [max((v for v in s if v is not None), default=None) for s in slices]
    top = max((p for p in peaks if p is not None), default=0.0)
    out = []
    for peak in peaks:
        if peak is None:
            out.append(" ")
        elif top <= 0:
            out.append(BARS[0])
        else:
            out.append(BARS[min(len(BARS) - 1, int(peak / top * (len(BARS) - 1) + 0.5))])
    return "".join(out)


def terminal_chart(series: Mapping[str, Sequence[tuple[float, float | None]]]) -> list[str]:
    """One line per shard: its name, the sparkline of its lag, and the peak."""
    lines = []
    for shard in sorted(series):
        values = [v for _, v in series[shard]]
        peak = max((v for v in values if v is not None), default=0.0)
        lines.append(f"  {shard:<24}{sparkline(values)}  peak {peak:,.0f} ms")
    return lines


def png_chart(series: Mapping[str, Sequence[tuple[float, float | None]]], path: Path) -> bool:
    """Write the lag chart to ``path``; False if matplotlib is not installed."""
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(9, 4))
    for shard in sorted(series):
        points = [(t, v) for t, v in series[shard] if v is not None]
        if points:
            ax.plot([t for t, _ in points], [v for _, v in points], label=shard)
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("MillisBehindLatest")
    ax.set_title("lag per shard")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True
