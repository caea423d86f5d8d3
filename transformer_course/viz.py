"""Plotting helpers shared by several chapters (hand-written, not exported).

Chapters add small, general helpers here instead of repeating plotting code. Every function draws
on a given ``ax`` (or a new figure) and returns the axes; the notebook ends the cell with
``plt.show()``.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import torch


def plot_heatmap(
    values,
    ax=None,
    *,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    title: str | None = None,
    cmap: str = "viridis",
    colorbar: bool = True,
    annotate: bool = False,
    vmin: float | None = None,
    vmax: float | None = None,
):
    """Draw a 2-D tensor or array ``values`` [rows, cols] as a heatmap with optional tick labels."""
    data = torch.as_tensor(values).detach().float().cpu()
    if data.ndim != 2:
        raise ValueError(f"plot_heatmap needs a 2-D [rows, cols] input, got shape {tuple(data.shape)}")
    if ax is None:
        _, ax = plt.subplots(figsize=(min(1 + 0.45 * data.shape[1], 12), min(1 + 0.4 * data.shape[0], 10)))
    image = ax.imshow(data.numpy(), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    if row_labels is not None:
        ax.set_yticks(range(len(row_labels)), labels=list(row_labels))
    if col_labels is not None:
        ax.set_xticks(range(len(col_labels)), labels=list(col_labels), rotation=60, ha="right")
    if annotate:
        for i in range(data.shape[0]):
            for j in range(data.shape[1]):
                ax.text(j, i, f"{data[i, j]:.2f}", ha="center", va="center", fontsize=7, color="w")
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    return ax


def plot_attention(weights, tokens_q: Sequence[str], tokens_k: Sequence[str] | None = None, ax=None, *, title=None,
                   annotate=False):
    """Attention weights [T_q, T_k] as a heatmap: rows are queries (who looks), columns keys (looked at)."""
    ax = plot_heatmap(
        weights,
        ax,
        row_labels=tokens_q,
        col_labels=tokens_k if tokens_k is not None else tokens_q,
        title=title,
        cmap="Blues",
        vmin=0.0,
        vmax=1.0,
        annotate=annotate,
    )
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    return ax
