"""A benchmark's side-by-side figures as a PNG: horizontal bars, one group of bars per
path measured, each bar one of the things compared (a core, a client, a baseline), its
figure written at its end.  Used by the ``scripts/bench*`` programs' ``--plot FILE``;
needs matplotlib (in kl's test extra)."""

from __future__ import annotations

from collections.abc import Sequence

COLOURS = ("#3b6ea8", "#e08a2c", "#5a9e4b", "#a34f8f", "#7f7f7f")


def bars(path: str, title: str, rows: Sequence[tuple[str, dict[str, float]]], unit: str, note: str = "") -> None:
    """Write ``rows`` (label, {series: figure}) as bars to the PNG ``path``; ``unit``
    names the figures' axis, ``note`` goes under it (where and how they were measured)."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib (it is in kl's test extra)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = list(dict.fromkeys(name for _, figures in rows for name in figures))
    colour = {name: COLOURS[k % len(COLOURS)] for k, name in enumerate(series)}
    bar = 0.26
    figure, axes = plt.subplots(figsize=(9, 1.2 + sum(bar * len(f) + 0.35 for _, f in rows)), dpi=110)
    top = max((value for _, figures in rows for value in figures.values()), default=1.0)
    ticks, labelled = [], set()
    at = 0.0
    for _, figures in rows:  # each row's bars together, only the series it has
        ticks.append(at + bar * (len(figures) - 1) / 2)
        for name, value in figures.items():
            drawn = axes.barh(at, value, height=bar * 0.9, color=colour[name], label=None if name in labelled else name)
            labelled.add(name)
            axes.bar_label(drawn, labels=[_short(value)], padding=3, fontsize=8)
            at += bar
        at += 0.35
    axes.set_yticks(ticks, [label for label, _ in rows], fontsize=9)
    axes.invert_yaxis()
    axes.set_xlim(0, top * 1.15)
    axes.set_xlabel(unit + (f"\n{note}" if note else ""), fontsize=9)
    axes.set_title(title, fontsize=11, loc="left")
    axes.spines[["top", "right"]].set_visible(False)
    if len(series) > 1:
        axes.legend(fontsize=8, loc="lower right", frameon=False)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def _short(value: float) -> str:
    for bound, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= bound:
            return f"{value / bound:.2f}{suffix}"
    return f"{value:.3g}"
