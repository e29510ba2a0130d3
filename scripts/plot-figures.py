#!/usr/bin/env python3
"""Draws the figures of README.md and docs/ from benchmark JSON, as plain SVG (no plotting
library needed).

  docs/figures/speedup-vs-acceptance.svg  speculative speedup over each engine's own plain
      decoding against the per-token acceptance rate, specd (fast and checkpoint rollback) and
      llama.cpp, one panel per draft length. Input: the JSON of
      `scripts/bench_vs_llamacpp.py --json` (its "synthetic" rows).
  docs/figures/width-cost.svg  the cost of a verification batch of w rows in one-row steps,
      specd against llama.cpp, per file. Input: the JSON of
      `scripts/bench_quant_vs_llamacpp.py --json` (a list of rows, or {"rows": [...]}).
  Either input may instead be a `specd bench --json` report (specd alone: its "synth" rows,
  its "speed" widths).

Usage: python3 scripts/plot-figures.py [--synth docs/figures/synth.json]
           [--widths docs/figures/widths.json] [--out docs/figures]

The committed inputs carry "host", "date", "command" and "source" keys; the figures print the
host and date under the plot. Re-run a benchmark with --json, point this script at the file and
commit both.
"""
import argparse
import json
import os
from xml.sax.saxutils import escape

# "specd fast" is the replay rollback under its earlier name (the committed JSON's).
COLORS = {"specd fast": "#1f77b4", "specd replay": "#1f77b4", "specd checkpoint": "#7fb3e0",
          "llama.cpp": "#d62728"}
FILE_COLORS = ["#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"]


class Svg:
    def __init__(self, w, h):
        self.w, self.h, self.parts = w, h, []

    def add(self, s):
        self.parts.append(s)

    def text(self, x, y, s, size=12, anchor="start", weight="normal", color="#222"):
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
                 f'font-weight="{weight}" fill="{color}">{escape(s)}</text>')

    def line(self, x1, y1, x2, y2, color="#888", width=1, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                 f'stroke="{color}" stroke-width="{width}"{d}/>')

    def polyline(self, pts, color, width=2, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        p = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        self.add(f'<polyline points="{p}" fill="none" stroke="{color}" stroke-width="{width}"{d}/>')
        for x, y in pts:
            self.add(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>')

    def write(self, path):
        with open(path, "w", encoding="utf-8") as f:
            f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.w}" height="{self.h}" '
                    f'viewBox="0 0 {self.w} {self.h}" font-family="sans-serif">\n')
            f.write(f'<rect width="{self.w}" height="{self.h}" fill="white"/>\n')
            f.write("\n".join(self.parts) + "\n</svg>\n")


def axes(svg, x0, y0, w, h, xs, ys, xlabel, ylabel, fmt_x=str, fmt_y=str):
    """Frame, grid and tick labels; returns functions mapping data to pixels."""
    xmin, xmax = xs[0], xs[-1]
    ymin, ymax = ys[0], ys[-1]
    fx = lambda v: x0 + (v - xmin) / (xmax - xmin) * w
    fy = lambda v: y0 + h - (v - ymin) / (ymax - ymin) * h
    for v in ys:
        svg.line(x0, fy(v), x0 + w, fy(v), color="#e5e5e5")
        svg.text(x0 - 6, fy(v) + 4, fmt_y(v), size=11, anchor="end")
    for v in xs:
        svg.text(fx(v), y0 + h + 16, fmt_x(v), size=11, anchor="middle")
    svg.line(x0, y0 + h, x0 + w, y0 + h, color="#444")
    svg.line(x0, y0, x0, y0 + h, color="#444")
    svg.text(x0 + w / 2, y0 + h + 34, xlabel, size=12, anchor="middle")
    svg.add(f'<text x="{x0 - 40:.1f}" y="{y0 + h / 2:.1f}" font-size="12" text-anchor="middle" '
            f'transform="rotate(-90 {x0 - 40:.1f} {y0 + h / 2:.1f})">{escape(ylabel)}</text>')
    return fx, fy


def legend(svg, x, y, items):
    for i, (name, color, dash) in enumerate(items):
        yy = y + 16 * i
        svg.line(x, yy - 4, x + 22, yy - 4, color=color, width=2, dash=dash)
        svg.text(x + 28, yy, name, size=11)


def from_specd_bench(data):
    """`specd bench --json` reports: its "synth" rows become the script's "synthetic" rows
    (one series per rollback mode), its "speed" widths one specd row of the width plot."""
    out = dict(data)
    if "synthetic" not in data and data.get("synth"):
        rows = {}
        for r in data["synth"]:
            if r.get("rate") is None:
                continue
            key = (r["rate"], r["n_max"])
            rows.setdefault(key, {"rate": r["rate"], "n_max": r["n_max"]})
            rows[key][f"specd {r['rollback']}"] = {"tok_s": r["tok_s"], "speedup": r["speedup"]}
        out["synthetic"] = list(rows.values())
    if "rows" not in data and isinstance(data.get("speed"), dict):
        ms = dict(data["speed"]["verify_ms_by_width"])
        widths = {str(w): v / ms[1] for w, v in ms.items()}
        out["rows"] = [{"file": os.path.basename(str(data.get("model", "specd"))),
                        "level": data.get("kernels", ""), "specd_widths": widths}]
    return out


def speedup_plot(data, path):
    data = from_specd_bench(data)
    rows = data["synthetic"]
    lens = sorted({r["n_max"] for r in rows})
    engines = [e for e in COLORS if any(e in r for r in rows)]
    top = max(max(r[e]["speedup"] for e in engines if e in r) for r in rows)
    ymax = max(1.0, float(int(top) + 1))
    ys = [v * 0.5 for v in range(int(ymax * 2) + 1)]
    pw, ph, left, gap = 300, 220, 70, 60
    svg = Svg(left + len(lens) * (pw + gap) + 120, ph + 140)
    svg.text(svg.w / 2, 20, "Speculative speedup over each engine's own plain decoding",
             size=14, anchor="middle", weight="bold")
    for i, n in enumerate(lens):
        x0 = left + i * (pw + gap)
        fx, fy = axes(svg, x0, 56, pw, ph, [0.0, 0.25, 0.5, 0.75, 1.0], ys,
                      "per-token acceptance rate", "speedup (×)",
                      fmt_x=lambda v: f"{v:g}", fmt_y=lambda v: f"{v:g}")
        svg.line(x0, fy(1.0), x0 + pw, fy(1.0), color="#555", dash="4,3")
        svg.text(x0 + pw / 2, 48, f"drafts of up to {n} tokens", size=12, anchor="middle")
        for e in engines:
            pts = sorted((r["rate"], r[e]["speedup"]) for r in rows if r["n_max"] == n and e in r)
            svg.polyline([(fx(a), fy(s)) for a, s in pts], COLORS[e],
                         dash="5,3" if e == "specd checkpoint" else None)
    legend(svg, left + len(lens) * (pw + gap) - 40, 76,
           [(e, COLORS[e], "5,3" if e == "specd checkpoint" else None) for e in engines])
    parts = [data.get("host"), data.get("date"), os.path.basename(str(data.get("model", ""))),
             f"{data['threads']} threads" if data.get("threads") else None,
             f"{data['n_gen']} tokens" if data.get("n_gen") else None, "synthetic acceptance"]
    foot = ", ".join(p for p in parts if p)
    svg.text(left, ph + 132, foot, size=11, color="#555")
    svg.write(path)


def width_plot(data, path):
    data = from_specd_bench(data) if isinstance(data, dict) else data
    rows = data["rows"] if isinstance(data, dict) else data
    ws = sorted({int(w) for r in rows for w in r["specd_widths"]} | {1})
    def steps(r, key):
        d = {int(k): v for k, v in r.get(key, {}).items()}
        d.setdefault(1, 1.0)
        return [(w, d[w]) for w in ws if w in d]
    vals = [v for r in rows for k in ("specd_widths", "llama_widths") for _, v in steps(r, k)]
    top, low = max(vals), min(vals)
    ymin = 1.0 if low >= 1.0 else 0.75
    ymax = max(2.0, float(int(top * 2) + 1) / 2)
    ys = [ymin + v * 0.25 for v in range(int((ymax - ymin) * 4) + 1)]
    pw, ph, left = 420, 240, 70
    svg = Svg(left + pw + 230, ph + 120)
    svg.text(svg.w / 2, 22, "Cost of a verification batch of w rows, in one-row steps",
             size=14, anchor="middle", weight="bold")
    fx, fy = axes(svg, left, 40, pw, ph, ws, ys, "rows in the batch (w)", "one-row steps",
                  fmt_x=str, fmt_y=lambda v: f"{v:g}")
    items = []
    for i, r in enumerate(rows):
        c = FILE_COLORS[i % len(FILE_COLORS)]
        name = r["file"].replace(".gguf", "").replace("q08b-", "")
        svg.polyline([(fx(w), fy(s)) for w, s in steps(r, "specd_widths")], c)
        items.append((f"{name} specd", c, None))
        if r.get("llama_widths"):
            svg.polyline([(fx(w), fy(s)) for w, s in steps(r, "llama_widths")], c, width=1.5,
                         dash="5,3")
            items.append((f"{name} llama.cpp", c, "5,3"))
    legend(svg, left + pw + 20, 60, items)
    meta = data if isinstance(data, dict) else {}
    level = rows[0].get("level")
    parts = [meta.get("host"), meta.get("date"), f"level {level}" if level else None]
    foot = ", ".join(p for p in parts if p)
    svg.text(left, ph + 110, foot, size=11, color="#555")
    svg.write(path)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    figs = os.path.join(here, "..", "docs", "figures")
    ap = argparse.ArgumentParser()
    ap.add_argument("--synth", default=os.path.join(figs, "synth.json"))
    ap.add_argument("--widths", default=os.path.join(figs, "widths.json"))
    ap.add_argument("--out", default=figs)
    a = ap.parse_args()
    with open(a.synth, encoding="utf-8") as f:
        speedup_plot(json.load(f), os.path.join(a.out, "speedup-vs-acceptance.svg"))
    with open(a.widths, encoding="utf-8") as f:
        width_plot(json.load(f), os.path.join(a.out, "width-cost.svg"))
    print("wrote", os.path.join(a.out, "speedup-vs-acceptance.svg"), "and",
          os.path.join(a.out, "width-cost.svg"))


if __name__ == "__main__":
    main()
