"""The plumbing of every picture keyshot draws (PNG through matplotlib's Agg backend, no display): a figure,
its PNG bytes, and the panel that says a picture has no data. ``keyshot metrics``' operating-point pictures
and ``keyshot report``'s plots use these."""

from __future__ import annotations

import io


def figure(width: float = 5.2, height: float = 3.4):
    """A matplotlib figure on the Agg canvas (no pyplot state, safe in threads)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def png(fig) -> bytes:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def no_data(ax, what: str, fontsize: int = 11) -> None:
    """An empty panel that says why it is empty."""
    ax.text(0.5, 0.5, f"no data: {what}", ha="center", va="center", fontsize=fontsize, color="#5b6475")
    ax.set_xticks([])
    ax.set_yticks([])
