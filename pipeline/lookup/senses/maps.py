"""Sense maps: a clustering (``cluster_senses``) drawn for people.

    result = cluster_senses("data/ds-top.lance", ["play"])
    write_sense_map_png(result, "play.png")    # matplotlib: title, axes, legend
    write_sense_map_html(result, "play.html")  # plotly: hover a point to read its sentence

Both show the 2-D PCA projection of the occurrences' unit vectors, one colour per
cluster, each cluster named in the legend by its most typical context words; the PNG's
legend adds the example nearest the cluster's centre, the HTML shows every sentence on
hover with the word in bold. The HTML embeds plotly.js (about 4.6 MB), so it opens with no
network. matplotlib draws on its Agg canvas through ``Figure`` objects: no pyplot, no
global backend switch.
"""

from __future__ import annotations

import html
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError
from schemas.files import write_whole

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from pipeline.lookup.senses.clusters import ClusterResult
    from pipeline.lookup.senses.hits import Hit

# matplotlib's tab10 colours, shared by both maps so a sense has one colour everywhere.
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
HOVER_CHARS = 360  # of the sentence around the word, in the HTML's hover box


def html_text(text: str) -> str:
    """Text for plotly's HTML-like labels: ``& < >`` escaped, quotes kept (plotly.js knows
    only a few named entities: ``&quot;`` would show as typed)."""
    return html.escape(text, quote=False)


def plot_text(text: str) -> str:
    """Text for matplotlib, which reads ``$...$`` as math: a corpus's dollars stay dollars."""
    return text.replace("$", r"\$")


def colour(label: int) -> str:
    return COLOURS[label % len(COLOURS)]


def map_title(result: ClusterResult) -> str:
    """``Senses of "play": mix top, k=3 (auto, silhouette 0.121)``."""
    words = " / ".join(f'"{w}"' for w in result.words)
    chosen = f"k={result.k}"
    if result.auto and result.silhouette is not None:
        chosen += f" (auto, silhouette {result.silhouette:.3f})"
    return f"Senses of {words}: mix {result.mix or '?'}, {chosen}"


def map_subtitle(result: ClusterResult) -> str:
    where = f" in documents with {' '.join(result.filters)}" if result.filters else ""
    return (f"{occurrence_count(result)}{where}; each dot is one context, placed by PCA "
            "of its contextual vector")


def occurrence_count(result: ClusterResult) -> str:
    """What each number counts: ``291 uses in 229 distinct contexts (62 repeat a context:
    counted and drawn once)``, and a sample when one was drawn."""
    n, total, distinct = len(result.occurrences), result.n_rows, result.n_distinct
    text = f"{total} uses"
    repeated = total - distinct
    if repeated > 0:
        text += (f" in {distinct} distinct contexts ({repeated} repeat a sentence already "
                 "seen: counted once, in the tables per group, and drawn once)")
    if distinct > n:
        text += f"; a random {n} of the {distinct} contexts clustered and drawn"
    return text


def axis_labels(result: ClusterResult) -> tuple[str, str]:
    return (f"principal component 1 ({result.explained[0]:.0%} of variance)",
            f"principal component 2 ({result.explained[1]:.0%} of variance)")


def legend_labels(result: ClusterResult, snippet_chars: int = 70) -> list[str]:
    """Per cluster: its name, then its most central example on a second line."""
    labels = []
    for cluster in result.clusters:
        example = cluster.examples[0].snippet(snippet_chars) if cluster.examples else ""
        labels.append(f"{cluster.name()}\n    e.g. {example}" if example else cluster.name())
    return labels


def sense_map_figure(result: ClusterResult, width: float = 9.0, height: float = 6.5) -> Figure:
    """The static map as a matplotlib ``Figure`` (Agg canvas attached, nothing shown)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for cluster, label in zip(result.clusters, legend_labels(result), strict=True):
        xy = result.points[result.labels == cluster.label]
        axes.scatter(xy[:, 0], xy[:, 1], s=18, alpha=0.75, color=colour(cluster.label),
                     edgecolors="none", label=plot_text(label))
    figure.suptitle(plot_text(map_title(result)), fontsize=13, fontweight="bold")
    axes.set_title(plot_text(map_subtitle(result)), fontsize=9, color="#555555")
    x_label, y_label = axis_labels(result)
    axes.set_xlabel(x_label)
    axes.set_ylabel(y_label)
    axes.grid(alpha=0.25)
    # Below the axes: legend entries are long (typical words plus an example).
    figure.legend(loc="outside lower center", ncols=1, fontsize=8.5, frameon=False,
                  markerscale=1.6, title="senses (most typical context words; the example "
                  "nearest the centre)", title_fontsize=8.5, alignment="left")
    return figure


def write_sense_map_png(result: ClusterResult, path: str | Path, dpi: int = 120) -> Path:
    figure = sense_map_figure(result)
    return write_whole(check_writable(path), lambda tmp: figure.savefig(tmp, dpi=dpi, format="png"))


def hover_text(hit: Hit, chars: int = HOVER_CHARS, wrap: int = 80) -> str:
    """The sentence (about ``chars`` of it around the word) with the word in bold,
    HTML-escaped and wrapped for plotly's hover box, under where it comes from."""
    left, right = "\x00", "\x01"  # placeholders that survive escaping, swapped for <b>
    text = hit.snippet(chars, left, right) if len(hit.sentence) > chars \
        else " ".join(hit.highlighted(left, right).split())
    lines = textwrap.wrap(text, wrap, break_long_words=False, break_on_hyphens=False)
    body = "<br>".join(html_text(line) for line in lines)
    body = body.replace(left, "<b>").replace(right, "</b>")
    fields = hit.field_text()
    where = f"{html_text(hit.doc_id)} #{hit.sent_idx}" + \
        (f" ({html_text(fields)})" if fields else "")
    return f"<i>{where}</i><br>{body}"


def sense_map_plotly(result: ClusterResult) -> Any:
    """The interactive map as a plotly ``Figure``: a trace per cluster, hover = sentence."""
    import plotly.graph_objects as go

    figure = go.Figure()
    for cluster in result.clusters:
        members = (result.labels == cluster.label).nonzero()[0]
        figure.add_trace(go.Scatter(
            x=result.points[members, 0], y=result.points[members, 1], mode="markers",
            name=html_text(cluster.name()), marker={"size": 7, "opacity": 0.75,
                                                      "color": colour(cluster.label)},
            hovertext=[hover_text(result.occurrences[i]) for i in members],
            hovertemplate="%{hovertext}<extra></extra>"))
    x_label, y_label = axis_labels(result)
    figure.update_layout(
        title={"text": f"{html_text(map_title(result))}<br><sup>"
                       f"{html_text(map_subtitle(result))}; hover a dot to read it</sup>"},
        xaxis_title=x_label, yaxis_title=y_label, template="plotly_white",
        legend={"title": {"text": "senses (most typical context words)"}},
        hoverlabel={"align": "left"}, width=1000, height=700)
    return figure


def write_sense_map_html(result: ClusterResult, path: str | Path) -> Path:
    figure = sense_map_plotly(result)
    # plotly.js inside the file: it must open anywhere, offline included.
    return write_whole(check_writable(path), lambda tmp: figure.write_html(
        tmp, include_plotlyjs=True, full_html=True))


def check_writable(path: str | Path) -> Path:
    """``path`` if its folder exists (checked before the work, not after)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise ElmoUserError(f"cannot write {path}: folder {path.parent} does not exist")
    return path
