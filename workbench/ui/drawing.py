"""Static HTML views of a slice shape: its catalog facts, and its chips grouped by host.

Pure functions from a :class:`~workbench.tpu.SliceShape` to HTML strings, so the picker,
a notebook cell (``IPython.display.HTML``) and a test all draw the same thing.
"""

from __future__ import annotations

import html
import math

from workbench.tpu.catalog import SliceShape

# Big pods have hundreds of hosts; a drawing of every one would be a wall of boxes.
MAX_HOSTS_DRAWN = 32

_CHIP = 18
_GAP = 4
_PAD = 8
_LABEL = 14


def _chip_grid(shape: SliceShape) -> tuple[int, int]:
    """Rows and columns of chips inside one host box."""
    per_host = shape.chips_per_host
    if shape.single_host and len(shape.topology.split("x")) == 2:
        rows, cols = (int(d) for d in shape.topology.split("x"))
        return rows, cols
    rows = int(math.sqrt(per_host)) or 1
    return rows, math.ceil(per_host / rows)


def slice_svg(shape: SliceShape, max_hosts: int = MAX_HOSTS_DRAWN) -> str:
    """An SVG drawing of a slice: one box per host, its chips inside, numbered by rank.

    Args:
        shape: the slice shape to draw (from :func:`workbench.parse_shape`).
        max_hosts: draw at most this many hosts; the rest are summarised in a line.

    Returns:
        An ``<svg>`` element as a string, ready for an HTML widget or ``display(HTML(...))``.

    Raises:
        ValueError: ``max_hosts`` is not a positive whole number.
    """
    if isinstance(max_hosts, bool) or not isinstance(max_hosts, int) or max_hosts < 1:
        raise ValueError(f"max_hosts must be a positive whole number, got {max_hosts!r}.")
    rows, cols = _chip_grid(shape)
    drawn = min(shape.hosts, max_hosts)
    host_w = cols * _CHIP + (cols - 1) * _GAP + 2 * _PAD
    host_h = rows * _CHIP + (rows - 1) * _GAP + 2 * _PAD + _LABEL
    per_row = drawn if drawn <= 8 else math.ceil(math.sqrt(drawn * 2))
    host_rows = math.ceil(drawn / per_row)
    more = shape.hosts - drawn
    width = per_row * (host_w + _GAP) + _GAP
    height = host_rows * (host_h + _GAP) + _GAP + (18 if more else 0)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="{html.escape(shape.label)}: {shape.hosts} host(s) x '
        f'{shape.chips_per_host} chip(s)" style="font-family:sans-serif">'
    ]
    for host in range(drawn):
        x0 = _GAP + (host % per_row) * (host_w + _GAP)
        y0 = _GAP + (host // per_row) * (host_h + _GAP)
        parts.append(
            f'<rect x="{x0}" y="{y0}" width="{host_w}" height="{host_h}" rx="5" '
            'fill="#eef3fb" stroke="#5b7db1"/>'
            f'<text x="{x0 + _PAD}" y="{y0 + _LABEL - 2}" font-size="10" fill="#2b4a7a">'
            f"host {host}</text>"
        )
        for index in range(shape.chips_per_host):
            r, c = divmod(index, cols)
            cx = x0 + _PAD + c * (_CHIP + _GAP)
            cy = y0 + _LABEL + _PAD + r * (_CHIP + _GAP)
            rank = host * shape.chips_per_host + index
            parts.append(
                f'<rect x="{cx}" y="{cy}" width="{_CHIP}" height="{_CHIP}" rx="2" '
                'fill="#3f7fd9"/>'
                f'<text x="{cx + _CHIP / 2}" y="{cy + _CHIP / 2 + 3}" font-size="8" '
                f'fill="white" text-anchor="middle">{rank}</text>'
            )
    if more:
        parts.append(
            f'<text x="{_GAP}" y="{height - 5}" font-size="11" fill="#444">'
            f"... and {more} more host(s) of {shape.chips_per_host} chips</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def facts_html(shape: SliceShape) -> str:
    """The catalog facts of a shape as a small two-column HTML table.

    Args:
        shape: the slice shape to describe.

    Returns:
        An HTML ``<table>`` string.
    """
    facts = shape.describe()
    rows = [
        ("pod type", facts["pod_type"]),
        ("chips", facts["chips"]),
        ("hosts", facts["hosts"]),
        ("chips per host", facts["chips_per_host"]),
        ("HBM", f"{facts['hbm_gib_per_chip']:g} GiB/chip, {facts['hbm_gib_total']:g} GiB total"),
        (
            "peak bf16",
            f"{facts['peak_bf16_tflops_per_chip']:g} TFLOP/s/chip, "
            f"{facts['peak_bf16_tflops_total']:g} TFLOP/s total",
        ),
    ]
    rows += [(f"GKE {key}", value) for key, value in facts["gke_node_selector"].items()]
    cell = "padding:0 10px 0 0;line-height:1.4;text-align:left"
    cells = "".join(
        f'<tr><td style="{cell};color:#555">{html.escape(str(k))}</td>'
        f'<td style="{cell}"><code>{html.escape(str(v))}</code></td></tr>'
        for k, v in rows
    )
    return f'<table style="font-size:12px;border-collapse:collapse">{cells}</table>'


def agg_figure(figsize: tuple[float, float]):
    """A matplotlib Figure on its own Agg canvas: pyplot's global state (and a notebook's
    inline backend) stays out of the training thread that draws it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=figsize)
    FigureCanvasAgg(figure)
    return figure


def png_of(figure, dpi: int) -> bytes:
    """``figure`` laid out and rendered as PNG bytes."""
    import io

    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()

