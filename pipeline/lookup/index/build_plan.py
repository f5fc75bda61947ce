"""An index build's first two steps: its settings (``BuildSettings``, checked once when
made) and its plan (``plan_build``: whether the index at ``out`` is created or extended,
of which kind, which committed token files it gains and which it loses), a pure function
of the settings, the dataset and the index as published (``PublishedIndex``). The third
step, carrying the plan out through the atomic publish, is ``build.execute_build``; what
``elmo index build``, a job's refresh and ``pipeline.build_index`` run is
``build.build_index``, the three in turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError, SettingError
from pipeline.lookup.index.meta import (
    INDEX_KINDS,
    NEW_INDEX_COMPACT,
    TABLE,
    VECTOR_DTYPE,
    VECTOR_DTYPES,
    IndexMeta,
    SearchParams,
    read_meta,
    stale_rows,
)
from pipeline.lookup.index.publish import damage
from pipeline.lookup.index.words import WordSelection
from schemas.mix_specs import Mix

if TYPE_CHECKING:
    from schemas.dataset import Dataset


@dataclass(frozen=True)
class BuildSettings:
    """What a build is asked for, checked when made (a ``SettingError`` in the API's
    terms; the CLI renders it with its flags). ``words``: which words a new index holds
    (an existing one keeps its own selection); ``compact``: keep no vectors (True), keep
    them in LanceDB's HNSW, tunable with ``kind`` and ``search`` (False), or as the index
    at ``out`` was made, compact for a new one (None)."""

    dataset: str
    mix: str | Mix
    out: str
    kind: str = "auto"
    rebuild: bool = False
    search: SearchParams | None = None
    storage_options: dict | None = None
    words: WordSelection | None = None
    vector_dtype: str = VECTOR_DTYPE
    compact: bool | None = None

    def __post_init__(self) -> None:
        if self.kind not in INDEX_KINDS:
            raise SettingError("kind", lambda n: f"{n('kind')} must be one of "
                               f"{', '.join(INDEX_KINDS)}")
        if self.vector_dtype not in VECTOR_DTYPES:
            raise SettingError("vector_dtype", lambda n: (
                f"{n('vector_dtype')} must be one of {', '.join(VECTOR_DTYPES)}"))
        for name, value in ((n, getattr(self.search, n)) for n in ("nprobes", "ef",
                                                                   "refine_factor")
                            if self.search is not None):
            if value is not None and value < 1:
                raise SettingError(name, lambda n, name=name: f"{n(name)} must be at least 1")


@dataclass(frozen=True)
class PublishedIndex:
    """The index at ``out`` as its last finished build left it: its metadata (None: no
    index there), whether its token table exists, and why it cannot be read back at the
    versions it names (``publish.damage``; None: it can)."""

    meta: IndexMeta | None
    has_table: bool
    damage: str | None = None

    @classmethod
    def read(cls, out: str, storage_options: dict | None, db: Any) -> PublishedIndex:
        meta = read_meta(out, storage_options)
        has_table = TABLE in db.list_tables().tables
        broken = damage(db, meta) if meta is not None and has_table else None
        return cls(meta, has_table, broken)


@dataclass(frozen=True)
class BuildPlan:
    """What a build does: ``extends`` the published index of this metadata (None: creates
    one, tables overwritten, its fields and words settled now), of which kind (``compact``,
    ``kind``), with which words (``words``: a new index's), dropping the rows of the
    documents ``delete_docs`` (a job's refresh) and of the files ``delete``, and adding
    those of ``add`` (key, path; a file already indexed is added again whole); ``kept``:
    files already indexed and left as they are. ``why_new``: why a published index is
    built anew (None: none was, or it is kept)."""

    out: str
    mix: Mix
    compact: bool
    kind: str
    extends: IndexMeta | None
    why_new: str | None
    words: WordSelection
    delete: tuple[str, ...]
    add: tuple[tuple[str, str], ...]
    kept: int
    delete_docs: tuple[str, ...] = ()

    @property
    def creates(self) -> bool:
        return self.extends is None

    def describe(self) -> list[str]:
        """The plan in lines, for a person."""
        what = "create" if self.creates else "extend"
        lines = [f"{what} {'a compact' if self.compact else 'a full'} index at {self.out} "
                 f"(mix {self.mix.name}, vector index {self.kind})"]
        if self.why_new:
            lines.append(self.why_new)
        if self.creates:
            lines.append(f"holding {self.words.describe()}")
        lines.append(f"add {len(self.add)} files, remove {len(self.delete)}, keep "
                     f"{self.kept}" + (f"; remove the rows of {len(self.delete_docs)} "
                                       "documents" if self.delete_docs else ""))
        return lines


def plan_build(settings: BuildSettings, ds: Dataset, published: PublishedIndex) -> BuildPlan:
    """The plan of a build of ``settings`` from ``ds`` over ``published`` (reads no file
    of the index); the settings that do not fit the index there are refused here."""
    out, made = settings.out, published.meta
    if ds.descriptor.n_output_layers < 1:
        raise ElmoUserError(f"{settings.dataset} stores no layers to index")
    the_mix = ds.mix(settings.mix)
    compact = settings.compact
    if compact is None:
        # --rebuild keeps the kind too: only --full / --compact change it.
        compact = made.compact if made is not None else NEW_INDEX_COMPACT
    _refuse_tuning_a_compact_index(compact, settings, made)
    extends, why_new = None, None
    if made is not None and published.has_table and not settings.rebuild:
        why_new = _why_built_anew(ds, the_mix, out, made, compact)
        if why_new is None and published.damage is not None:
            why_new = f"{out}: {published.damage}: building it anew"
        extends = made if why_new is None else None
    words = settings.words
    if extends is not None and words is not None and not words.everything \
            and words.to_json() != extends.words:
        raise SettingError("rebuild", lambda n: (
            f"{out} holds {extends.selection().describe()}; to index {words.describe()} add "
            f"{n('rebuild=True')} (or use another {n('out')})"))
    files = ds.shard_files("tokens")
    committed = {key for key, _ in files}
    indexed = [] if extends is None else extends.indexed
    # Rows of shard files that are no longer committed (a part deleted, or a shard
    # re-embedded under a new run id) leave the index: it stays equal to the dataset's
    # committed view without a rebuild.
    delete = tuple(key for key in indexed if key not in committed)
    add = tuple((key, path) for key, path in files if key not in set(indexed))
    return BuildPlan(out=out, mix=the_mix, compact=compact, kind=settings.kind,
                     extends=extends, why_new=why_new, words=words or WordSelection(),
                     delete=delete, add=add, kept=len(files) - len(add))


def _why_built_anew(ds: Dataset, the_mix: Mix, out: str, meta: IndexMeta, compact: bool
                    ) -> str | None:
    """None when new rows can be added to the published index of ``meta``; why it is
    built again when its rows are of an older generation (``meta.stale_rows``). An index
    of another model, mix or kind is refused: the user chooses ``--rebuild`` or another
    ``--out``."""
    if meta.model_fingerprint != ds.descriptor.model_fingerprint:
        raise SettingError("rebuild", lambda n: f"{out} indexes a dataset of another "
                           f"model; use {n('rebuild=True')} or another {n('out')}")
    if meta.compact != compact:
        raise SettingError("rebuild", lambda n: (
            f"{out} is {'' if meta.compact else 'not '}a compact index; to build it "
            f"{'' if compact else 'not '}compact add {n('rebuild=True')} (or use another "
            f"{n('out')})"))
    if not meta.the_mix().same_vectors(the_mix):
        raise SettingError("rebuild", lambda n: (
            f"{out} holds mix {meta.mix_name!r} ({meta.the_mix().describe()}); asked for "
            f"{the_mix.describe()}: use {n('rebuild=True')} or another {n('out')}"))
    stale = stale_rows(meta)
    return None if stale is None else f"{out} was built {stale}: rebuilding it"


def _refuse_tuning_a_compact_index(compact: bool, settings: BuildSettings,
                                   made: IndexMeta | None) -> None:
    if compact and (settings.kind != "auto" or settings.search is not None):
        both = made is not None and made.compact and not settings.rebuild
        raise SettingError("compact", lambda n: (
            f"{n('kind and search')} tune a full index (LanceDB's HNSW); add "
            f"{n('compact=False')}{' ' + n('rebuild=True') if both else ''}, or leave them "
            "out: a compact index measures its own probes"))
