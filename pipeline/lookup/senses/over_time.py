"""A word's senses across groups of documents: the share of each sense per group (per
quarter century with ``by="year", bin=25``), each sense with its label and example uses.

    timeline = sense_timeline("data/sotu-top.lance", "union", by="year", bin=25)
    write_timeline_png(timeline, "union.png")    # stacked bars, labelled axes
    write_timeline_html(timeline, "union.html")  # the same, interactive (plotly, offline)

The senses are ``cluster_senses``'s over all the word's forms (those sharing its stem, as
the ranking compares them); the counts are ``sense_tables.breakdown_of``'s: distinct
contexts, a sentence repeated in many documents counted once (``senses.contexts``).
``elmo senses change WORD``, ``GET /senses/{word}/change`` and the explorer page's "over
time" view all show this.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.lookup.doc_fields import Filters
from pipeline.lookup.senses.clusters import cluster_senses
from pipeline.lookup.senses.maps import check_writable, colour, html_text, plot_text
from pipeline.lookup.senses.tables import SenseBreakdown, bin_of, breakdown_of, field_value
from schemas.files import write_whole

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from pipeline.lookup.index.sense_index import SenseIndex
    from pipeline.lookup.senses.hits import Hit

USES_PER_GROUP = 50  # uses listed per group (the page lists them when a group is clicked)


@dataclass
class SenseTimeline:
    word: str
    breakdown: SenseBreakdown  # counts per group and sense
    examples: list[list[Hit]]  # per sense: the uses nearest its centre
    uses: dict[str, list[tuple[int, Hit]]] = field(default_factory=dict)  # group -> (sense, use)
    mix: str = ""
    k: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (``GET /senses/{word}/change``)."""
        def use(sense: int, hit: Hit) -> dict[str, Any]:
            return {"sense": sense + 1, "doc_id": hit.doc_id, "sent_idx": hit.sent_idx,
                    "tok_idx": hit.tok_idx, "token": hit.token, "sentence": hit.sentence,
                    "start": hit.start, "end": hit.end, "fields": hit.fields}

        return {"word": self.word, "mix": self.mix, "k": self.k, **self.breakdown.to_dict(),
                "examples": [[use(i, h) for h in hits] for i, hits in
                             enumerate(self.examples)],
                "uses": {group: [use(s, h) for s, h in items]
                         for group, items in self.uses.items()}}


def sense_timeline(index: str | SenseIndex, word: str, by: str, bin: float | None = None, *,
                   k: int | str = "auto", filters: Filters = None, examples: int = 3,
                   uses_per_group: int = USES_PER_GROUP, centre: str = "case",
                   seed: int = 0) -> SenseTimeline:
    """Cluster ``word``'s uses into senses, then count each sense per group of document
    field ``by`` (numbers in bins of ``bin``); a bad field or bin is a user error before
    anything is drawn (``breakdown_of``)."""
    from pipeline.lookup.index.sense_index import SenseIndex
    from pipeline.lookup.senses.contexts import word_forms
    from pipeline.lookup.senses.hits import distinct_contexts

    ix = index if isinstance(index, SenseIndex) else SenseIndex(index)
    result = cluster_senses(ix, word_forms(ix, word), k=k, examples=examples,
                            filters=filters, centre=centre, seed=seed)
    breakdown = breakdown_of(result, by, bin)
    uses: dict[str, list[tuple[int, Hit]]] = {row.value: [] for row in breakdown.rows}
    row_of_start = {row.start: row.value for row in breakdown.rows}  # the rows' own labels
    every = result.all_occurrences or result.occurrences
    labels = (result.all_labels if len(result.all_labels) else result.labels).tolist()
    group_of = [row_of_start[bin_of(field_value(h, by), bin)[0]] for h in every]
    counted = distinct_contexts(every, group_of)
    for hit, label, value in zip([every[i] for i in counted], [labels[i] for i in counted],
                                 [group_of[i] for i in counted], strict=True):
        group = uses[value]
        if len(group) < uses_per_group:
            group.append((label, hit))
    return SenseTimeline(word, breakdown, [c.examples for c in result.clusters], uses,
                         result.mix, result.k)


def timeline_lines(timeline: SenseTimeline) -> list[str]:
    """The senses with an example each, then the share of each sense per group."""
    b = timeline.breakdown
    forms = [w for w in b.words if w != timeline.word.lower()]
    lines = [f"senses of {timeline.word!r}{' (with ' + ', '.join(forms) + ')' if forms else ''}"
             f" by {b.by}{f' (bins of {b.bin:g})' if b.bin else ''}, mix {timeline.mix}; "
             "the table counts distinct contexts per group (a sentence repeated in many "
             "documents of a group counts once), a sense's size each context once:"]
    for name, hits in zip(b.senses, timeline.examples, strict=True):
        lines.append(f"  {name}")
        lines.extend(f"      e.g. {h.doc_id}#{h.sent_idx}: {h.snippet(90)}" for h in hits[:1])
    heads = [f"sense {i + 1}" for i in range(len(b.senses))]
    first = max([len(b.by), *(len(r.value) for r in b.rows)])
    lines.append("  ".join([b.by.ljust(first), "contexts".rjust(8),
                            *(h.rjust(14) for h in heads)]))
    for row in b.rows:
        cells = [f"{s:6.0%} ({c})".rjust(14) for c, s in zip(row.counts, row.shares(),
                                                              strict=True)]
        lines.append("  ".join([row.value.ljust(first), str(row.total).rjust(8), *cells]))
    return lines


def _title(timeline: SenseTimeline) -> str:
    b = timeline.breakdown
    binned = f" (bins of {b.bin:g})" if b.bin else ""
    return f'Senses of "{timeline.word}" by {b.by}{binned}: mix {timeline.mix}, k={timeline.k}'


def timeline_figure(timeline: SenseTimeline, width: float = 10.0, height: float = 6.5
                    ) -> Figure:
    """Stacked bars: a bar per group, a colour per sense, heights = shares of its uses."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    b = timeline.breakdown
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    x = np.arange(len(b.rows))
    bottom = np.zeros(len(b.rows))
    for i, name in enumerate(b.senses):
        share = np.array([row.shares()[i] for row in b.rows])
        example = timeline.examples[i][0].snippet(60) if timeline.examples[i] else ""
        label = f"{name}\n    e.g. {example}" if example else name
        axes.bar(x, share, bottom=bottom, color=colour(i), label=plot_text(label), width=0.8)
        bottom += share
    axes.set_xticks(x, [f"{row.value}\n({row.total})" for row in b.rows], fontsize=8,
                    rotation=45 if len(b.rows) > 8 else 0)
    axes.set_xlabel(f"{b.by}{f' (bins of {b.bin:g})' if b.bin else ''}; distinct contexts "
                    "in brackets")
    axes.set_ylabel("share of the word's distinct contexts")
    axes.set_ylim(0, 1)
    figure.suptitle(plot_text(_title(timeline)), fontsize=13, fontweight="bold")
    figure.legend(loc="outside lower center", ncols=1, fontsize=8.5, frameon=False,
                  title="senses (most typical context words; the use nearest the centre)",
                  title_fontsize=8.5, alignment="left")
    return figure


def write_timeline_png(timeline: SenseTimeline, path: str | Path, dpi: int = 120) -> Path:
    figure = timeline_figure(timeline)
    return write_whole(check_writable(path), lambda tmp: figure.savefig(tmp, dpi=dpi, format="png"))


def timeline_plotly(timeline: SenseTimeline) -> Any:
    """The stacked bars as a plotly ``Figure`` (hover: the sense's uses and share)."""
    import plotly.graph_objects as go

    b = timeline.breakdown
    figure = go.Figure()
    groups = [row.value for row in b.rows]
    for i, name in enumerate(b.senses):
        figure.add_trace(go.Bar(
            x=groups, y=[row.shares()[i] for row in b.rows], name=html_text(name),
            marker={"color": colour(i)}, customdata=[row.counts[i] for row in b.rows],
            hovertemplate=f"sense {i + 1}: %{{customdata}} distinct contexts (%{{y:.0%}})"
                          "<extra></extra>"))
    figure.update_layout(
        barmode="stack", title={"text": html_text(_title(timeline))}, template="plotly_white",
        xaxis_title=f"{b.by}{f' (bins of {b.bin:g})' if b.bin else ''}",
        yaxis_title="share of the word's distinct contexts", yaxis={"range": [0, 1]},
        legend={"title": {"text": "senses (most typical context words)"}},
        width=1000, height=650)
    return figure


def write_timeline_html(timeline: SenseTimeline, path: str | Path) -> Path:
    figure = timeline_plotly(timeline)
    return write_whole(check_writable(path), lambda tmp: figure.write_html(
        tmp, include_plotlyjs=True, full_html=True))
