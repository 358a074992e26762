"""A grouped bar chart written as SVG by hand (no plotting dependency).

One panel per file; in each, one group of bars per number of readers, one bar per mode,
on a log scale (the kernel is two orders of magnitude above a FUSE daemon).
"""

from __future__ import annotations

import math
from xml.sax.saxutils import escape

COLOURS = ("#4d4d4d", "#d95f02", "#7570b3", "#1b9e77", "#e7298a", "#66a61e", "#e6ab02")


def _fmt(v: float) -> str:
    if v >= 1_000_000:
        return f"{v / 1e6:.1f}M".replace(".0M", "M")
    if v >= 10_000:
        return f"{v / 1000:.0f}k"
    if v >= 1000:
        return f"{v / 1000:.1f}k".replace(".0k", "k")
    return f"{v:.0f}"


def grouped_bars(title: str, panels: dict[str, dict[int, dict[str, float]]],
                 labels: dict[str, str], ylabel: str = "reads/s (log scale)",
                 subtitle: str = "") -> str:
    """``panels``: panel name -> readers -> mode -> value. Modes are drawn in the order of
    ``labels``; a mode missing from a group is left out of it."""
    modes = [m for m in labels if any(m in g for p in panels.values() for g in p.values())]
    values = [v for p in panels.values() for g in p.values() for v in g.values() if v > 0]
    lo = 10 ** math.floor(math.log10(min(values))) if values else 1.0
    hi = 10 ** math.ceil(math.log10(max(values))) if values else 10.0
    if hi <= lo:
        hi = lo * 10
    grid_hi = hi
    hi = max(hi, 2.5 * max(values, default=1.0))  # headroom for the value labels
    pw, ph, left, top, bottom, gap = 300, 260, 70, 70, 40, 55
    width = max(left + len(panels) * (pw + gap) + 10, 620)
    cols = max(1, min(len(modes), (width - left) // 190))
    legend_h = 22 * ((len(modes) + cols - 1) // cols)
    height = top + ph + bottom + legend_h + 10

    def y(v: float) -> float:
        v = max(v, lo)
        return top + ph - ph * (math.log10(v) - math.log10(lo)) / (math.log10(hi)
                                                                      - math.log10(lo))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{width / 2:.0f}" y="20" text-anchor="middle" font-size="14" '
           f'font-weight="bold">{escape(title)}</text>',
           f'<text x="{width / 2:.0f}" y="36" text-anchor="middle" fill="#555">'
           f'{escape(subtitle)}</text>',
           f'<text x="14" y="{top + ph / 2:.0f}" text-anchor="middle" '
           f'transform="rotate(-90 14 {top + ph / 2:.0f})">{escape(ylabel)}</text>']
    for i, (name, groups) in enumerate(panels.items()):
        x0 = left + i * (pw + gap)
        out.append(f'<text x="{x0 + pw / 2:.0f}" y="{top - 12}" text-anchor="middle" '
                   f'font-weight="bold">{escape(name)}</text>')
        decade = lo
        while decade <= grid_hi * 1.001:  # grid lines and labels at every decade
            yy = y(decade)
            out.append(f'<line x1="{x0}" y1="{yy:.1f}" x2="{x0 + pw}" y2="{yy:.1f}" '
                       'stroke="#ddd"/>')
            out.append(f'<text x="{x0 - 4}" y="{yy + 4:.1f}" text-anchor="end" '
                       f'fill="#555">{_fmt(decade)}</text>')
            decade *= 10
        out.append(f'<rect x="{x0}" y="{top}" width="{pw}" height="{ph}" fill="none" '
                   'stroke="#888"/>')
        gw = pw / max(1, len(groups))
        bw = (gw - 16) / max(1, len(modes))
        for j, (readers, group) in enumerate(sorted(groups.items())):
            gx = x0 + j * gw + 8
            for k, mode in enumerate(modes):
                if mode not in group:
                    continue
                v = group[mode]
                bx, by = gx + k * bw, y(v)
                out.append(f'<rect x="{bx:.1f}" y="{by:.1f}" width="{bw - 1:.1f}" '
                           f'height="{top + ph - by:.1f}" fill="{COLOURS[k % len(COLOURS)]}">'
                           f'<title>{escape(labels[mode])}, {readers} readers: '
                           f'{v:.0f} reads/s</title></rect>')
                tx = bx + bw / 2 + 3
                out.append(f'<text x="{tx:.1f}" y="{by - 3:.1f}" font-size="8" '
                           f'transform="rotate(-90 {tx:.1f} {by - 3:.1f})">{_fmt(v)}</text>')
            out.append(f'<text x="{gx + (gw - 16) / 2:.1f}" y="{top + ph + 16}" '
                       f'text-anchor="middle">{readers} reader{"s" if readers > 1 else ""}'
                       '</text>')
    for k, mode in enumerate(modes):
        lx = left + (k % cols) * 190
        ly = top + ph + bottom + 22 * (k // cols)
        out.append(f'<rect x="{lx}" y="{ly - 10}" width="12" height="12" '
                   f'fill="{COLOURS[k % len(COLOURS)]}"/>')
        out.append(f'<text x="{lx + 18}" y="{ly}">{escape(labels[mode])}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
