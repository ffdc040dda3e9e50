"""Chart data for matplotlib figures: an IPython extension the code interpreter's kernels load
(`--ext=sandcell_charts`, server.py), so that a figure a cell displays carries, beside its PNG,
what E2B's SDKs read as `result.chart`: the chart's type, title, axes and elements (the lines'
points, the bars' values, the pie's wedges). server.py moves it from its MIME type to the
result's `chart` field.

Read from matplotlib's artists, never from the pixels: line charts from `Line2D`s, scatter
charts from `PathCollection` offsets, bar charts from `BarContainer`s, pie charts from
`Wedge`s, box-and-whisker charts from the statistics `Axes.bxp` drew (what `boxplot()` and
seaborn draw through: its artists are plain lines that do not say which is a median, so the
extension wraps `bxp` when matplotlib is imported and keeps them on the axes). A figure of several axes is a `superchart` of their charts; an axes with none of
these is `unknown`. A figure that cannot be read gets no chart data (the PNG still comes):
chart data is a convenience and never fails a cell.
"""

import datetime
import importlib.abc
import importlib.util
import itertools
import math
import sys

MIME = "application/vnd.sandcell.chart+json"
# Bounds: a chart of a million points is a PNG's job, not a JSON one's. Per line, and for
# the whole figure (its lines and axes together).
MAX_POINTS = 10_000
MAX_ELEMENTS = 1_000
MAX_FIGURE_POINTS = 100_000
MAX_AXES = 64


class _Budget:
    """What is left of the figure's point budget."""

    def __init__(self):
        self.left = MAX_FIGURE_POINTS

    def take(self, pairs):
        """At most MAX_POINTS of the (x, y) pairs, within what is left; never materialises
        more than it keeps."""
        n = min(MAX_POINTS, self.left)
        kept = [[_num(x), _num(y)] for x, y in itertools.islice(pairs, n)]
        self.left -= len(kept)
        return kept


def _num(v):
    """A JSON-safe scalar from a numpy or Python value (NaN and infinities as None)."""
    if type(v).__name__ == "datetime64":
        # .item() of a nanosecond datetime64 is an int of nanoseconds: its ISO text instead
        return str(v)
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, (datetime.datetime, datetime.date)):
        return v.isoformat()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (int, float, str)) or v is None:
        return v
    return str(v)


def _ticks(axis):
    # 12 significant digits: 1.2, not 1.2000000000000002 from the locator's arithmetic
    ticks = [float(f"{t:.12g}") for t in axis.get_ticklocs()]
    try:
        labels = [str(s) for s in axis.get_major_formatter().format_ticks(ticks)]
    except Exception:
        labels = [t.get_text() for t in axis.get_ticklabels()]
    return ticks, labels


def _axes_2d(ax):
    out = {"title": ax.get_title() or None}
    for name, axis, scale in (("x", ax.xaxis, ax.get_xscale()), ("y", ax.yaxis, ax.get_yscale())):
        ticks, labels = _ticks(axis)
        out[f"{name}_label"] = axis.get_label_text() or None
        out[f"{name}_unit"] = None
        out[f"{name}_ticks"] = ticks
        out[f"{name}_tick_labels"] = labels
        out[f"{name}_scale"] = _scale(axis, scale)
    return out


def _scale(axis, scale):
    # A date or category axis is linear to matplotlib; its converter says what it holds.
    get = getattr(axis, "get_converter", None)
    conv = type(get() if get else getattr(axis, "converter", None)).__name__
    if "Date" in conv:
        return "datetime"
    if "StrCategory" in conv:
        return "categorical"
    return scale if scale in ("linear", "log", "symlog", "logit", "function", "functionlog", "asinh") else "unknown"


def _label(artist, i):
    label = artist.get_label() or ""
    # matplotlib names unlabelled artists `_child0`, `_container1`...
    return f"series {i}" if not label or label.startswith("_") else label


def _line_chart(ax, lines, budget):
    elements = []
    for i, line in enumerate(lines[:MAX_ELEMENTS]):
        points = budget.take(zip(line.get_xdata(), line.get_ydata()))
        elements.append({"label": _label(line, i), "points": points})
    return {"type": "line", **_axes_2d(ax), "elements": elements}


def _scatter_chart(ax, collections, budget):
    elements = []
    for i, coll in enumerate(collections[:MAX_ELEMENTS]):
        points = budget.take(iter(coll.get_offsets()))
        elements.append({"label": _label(coll, i), "points": points})
    return {"type": "scatter", **_axes_2d(ax), "elements": elements}


def _bar_chart(ax, containers):
    from matplotlib.patches import Rectangle

    base = _axes_2d(ax)
    horizontal = any(getattr(c, "orientation", "vertical") == "horizontal" for c in containers)
    axis_ticks = base["y_ticks"] if horizontal else base["x_ticks"]
    axis_labels = base["y_tick_labels"] if horizontal else base["x_tick_labels"]
    by_position = dict(zip(axis_ticks, axis_labels))
    elements = []
    for i, container in enumerate(containers):
        group = _label(container, i)
        for bar in container.patches:
            if not isinstance(bar, Rectangle) or len(elements) >= MAX_ELEMENTS:
                continue
            if horizontal:
                where, value = bar.get_y() + bar.get_height() / 2, bar.get_width()
            else:
                where, value = bar.get_x() + bar.get_width() / 2, bar.get_height()
            label = by_position.get(float(where))
            if label is None:
                label = str(_num(round(where, 6)))
            elements.append({"label": label, "group": group, "value": _num(value)})
    return {"type": "bar", **base, "elements": elements}


def _pie_chart(ax, wedges):
    elements = []
    texts = [t for t in ax.texts if t.get_text()]
    for i, w in enumerate(wedges[:MAX_ELEMENTS]):
        label = w.get_label()
        if not label or label.startswith("_"):
            # pie() puts the labels in texts, in wedge order (then the autopct ones)
            label = texts[i].get_text() if i < len(texts) else f"slice {i}"
        elements.append({"label": label, "angle": _num(abs(w.theta2 - w.theta1)), "radius": _num(w.r)})
    return {"type": "pie", "title": ax.get_title() or None, "elements": elements}


def _box_chart(ax, stats):
    base = _axes_2d(ax)
    labels = base["x_tick_labels"]
    elements = []
    for i, st in enumerate(stats[:MAX_ELEMENTS]):
        label = st.get("label")
        if label is None:
            label = labels[i] if i < len(labels) else f"series {i}"
        elements.append({
            "label": str(label),
            "min": _num(st["whislo"]),
            "first_quartile": _num(st["q1"]),
            "median": _num(st["med"]),
            "third_quartile": _num(st["q3"]),
            "max": _num(st["whishi"]),
            "outliers": [_num(v) for v in list(st.get("fliers", []))[:MAX_POINTS]],
        })
    return {"type": "box_and_whisker", **base, "elements": elements}


BOX_STATS = "_sandcell_box_stats"


def _wrap_bxp(axes_module):
    """Axes.bxp, keeping the statistics it drew on the axes (for `_box_chart`)."""
    bxp = axes_module.Axes.bxp
    if getattr(bxp, "_sandcell", False):
        return

    def bxp_keeping_stats(self, bxpstats, *args, **kwargs):
        drawn = bxp(self, bxpstats, *args, **kwargs)
        try:
            kept = getattr(self, BOX_STATS, [])
            kept.extend(dict(st) for st in bxpstats)
            setattr(self, BOX_STATS, kept[:MAX_ELEMENTS])
        except Exception:
            pass
        return drawn

    bxp_keeping_stats._sandcell = True
    bxp_keeping_stats.__doc__ = bxp.__doc__
    axes_module.Axes.bxp = bxp_keeping_stats


class _WrapBxpOnImport(importlib.abc.MetaPathFinder):
    """Wraps `Axes.bxp` right after a cell imports matplotlib.axes, once: the kernel itself
    never imports matplotlib."""

    def find_spec(self, name, path, target=None):
        if name != "matplotlib.axes":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            try:
                _wrap_bxp(module)
            except Exception:
                pass

        loader.exec_module = exec_module
        return spec


def chart_of_axes(ax, budget=None):
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge

    budget = budget or _Budget()
    boxes = getattr(ax, BOX_STATS, None)
    if boxes and ax.get_lines():
        return _box_chart(ax, boxes)
    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if wedges:
        return _pie_chart(ax, wedges)
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    if bars:
        return _bar_chart(ax, bars)
    scatters = [c for c in ax.collections if isinstance(c, PathCollection) and len(c.get_offsets())]
    lines = [ln for ln in ax.get_lines() if len(ln.get_xdata())]
    if scatters and not lines:
        return _scatter_chart(ax, scatters, budget)
    if lines and not scatters:
        return _line_chart(ax, lines, budget)
    return {"type": "unknown", "title": ax.get_title() or None, "elements": []}


def chart_of_figure(fig):
    axes = [ax for ax in fig.get_axes() if ax.get_visible()][:MAX_AXES]
    if not axes:
        return None
    budget = _Budget()
    if len(axes) == 1:
        return chart_of_axes(axes[0], budget)
    title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else None
    elements = [chart_of_axes(ax, budget) for ax in axes]
    return {"type": "superchart", "title": title or None, "elements": elements}


def _format(fig):
    try:
        return chart_of_figure(fig)
    except Exception:
        return None


def _is_figure(obj):
    return any(
        c.__module__ == "matplotlib.figure" and c.__name__ == "Figure" for c in type(obj).__mro__
    )


def load_ipython_extension(ip):
    from IPython.core.formatters import JSONFormatter

    if "matplotlib.axes" in sys.modules:
        _wrap_bxp(sys.modules["matplotlib.axes"])
    elif not any(isinstance(f, _WrapBxpOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _WrapBxpOnImport())

    class ChartFormatter(JSONFormatter):
        """Figures only, matched by class name: matplotlib is imported by a cell, not here
        (a kernel that never plots never pays for it), and the kernel's start-up resets the
        printers a formatter registers by name before any cell runs."""

        format_type = MIME

        def __call__(self, obj):
            if not self.enabled or not _is_figure(obj):
                return None
            return _format(obj)

    ip.display_formatter.formatters[MIME] = ChartFormatter(parent=ip.display_formatter)
    # display() computes only the active types (those known at start-up by default)
    if MIME not in ip.display_formatter.active_types:
        ip.display_formatter.active_types.append(MIME)
