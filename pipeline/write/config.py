"""What an embedding run is asked to do: the model, the inputs, the output, the executor.

``EmbedConfig`` is the Python API of ``elmo embed`` and the one definition of its
settings: each field's metadata (pipeline/write/setting.py) gives its flag, job-spec key, help
and checks, from which ``elmo embed``'s parser (pipeline/embed_cli.py) and the job-spec
parser (jobs/spec.py) are built. ``problems`` checks values and the rules across fields
once for every surface; ``validate`` raises the first as an ``ElmoUserError`` naming the
flag to fix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import elmo_model
from elmo_model.errors import ElmoUserError, SettingError
from pipeline.tokenize import tokenizer_names
from pipeline.write.inputs import ReadOptions, SourceFile, list_sources
from pipeline.write.setting import exposed, settings_fields, value_problem
from schemas.layout import STORAGE_DTYPES

DEFAULT_MIN_ITEMS = 8  # at least this many work items (small corpora still spread over actors)
DEFAULT_ITEM_TOKENS = 262_144  # target tokens per work item, estimated from input bytes
DEFAULT_BATCH_TOKENS = 4096
# On a GPU a model call is one batch, 8x wider: the recurrence launches its kernels from
# the host once per time step, so a wider batch does more per launch (BENCHMARKS.md, "One
# GPU: model only vs end to end").
GPU_BATCH_TOKENS = 32_768
DEFAULT_MAX_SENTENCE_TOKENS = 256
DEFAULT_WINDOW_OVERLAP = 32
EXECUTORS = ("auto", "local", "ray")
DEVICES = ("auto", "cpu", "cuda")
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ModelSpec:
    options: str
    weights: str

    @classmethod
    def resolve(cls, model_dir: str | None = None, options: str | None = None,
                weights: str | None = None) -> ModelSpec:
        """``--model DIR``, or ``--options F --weights F``, or the bundled default model."""
        if options or weights:
            if not (options and weights):
                raise SettingError("options", lambda name: (
                    f"{name('options')} and {name('weights')} go together; give both or "
                    f"{name('model')}"))
            for path in (options, weights):
                if not Path(path).is_file():
                    raise ElmoUserError(f"model file not found: {path}")
            return cls(str(Path(options).resolve()), str(Path(weights).resolve()))
        from elmo_model.options_file import model_dir_files

        directory = Path(model_dir) if model_dir else elmo_model.default_model_dir()
        if model_dir is None and not (directory / elmo_model.OPTIONS_FILE).is_file():
            raise SettingError("model", lambda name: (
                f"no bundled model in {directory} yet; pass {name('model')} DIR or "
                f"{name('options')} FILE {name('weights')} FILE"))
        options_path, weights_path = model_dir_files(directory)
        return cls(str(options_path.resolve()), str(weights_path.resolve()))


# The model's settings besides ``model`` (a directory): the two files it may be given as.
MODEL_FILE_FLAGS = {"options": "--options", "weights": "--weights"}


def flag_of(setting: str) -> str:
    """The ``elmo embed`` flag of a setting: an ``EmbedConfig`` field, a read option
    (``format`` or ``read.format``) or a model file (``options``, ``weights``)."""
    if setting in MODEL_FILE_FLAGS:
        return MODEL_FILE_FLAGS[setting]
    name = setting.removeprefix("read.")
    classes = (ReadOptions,) if setting.startswith("read.") else (EmbedConfig, ReadOptions)
    for cls in classes:
        for f in settings_fields(cls):
            if f.name == name:
                return f.setting.flag or name
    return name


# Why a surface does not offer a setting (the surface test checks every field has one).
_JOB_PICKS_FILES = "a job embeds the files that changed since its last run"
_JOB_NAMES_PARTS = "a job names one part per source file (jobs/state.py part_name)"


@dataclass(frozen=True)
class EmbedConfig:
    """The settings of one embedding run, and their only definition: ``elmo embed``'s
    flags, a job spec's embed keys and their checks are generated from these fields'
    ``Setting`` metadata (pipeline/write/setting.py). Fields are in the order of the CLI help."""

    sources: list[str] = field(metadata=exposed(
        custom=True, flag="SOURCE_GLOB", job_key="source",
        help="file, directory or glob of any fsspec URI (file://, s3://, gs://, ...)"))
    out: str = field(metadata=exposed(
        custom=True, flag="--out", job_key="output",
        help="dataset URI to write into"))
    model: ModelSpec = field(metadata=exposed(
        custom=True, flag="--model", job_key="model",
        help="directory with options.json + weights"))
    allow_missing: bool = field(default=False, metadata=exposed(
        flag="--allow-missing", job_key="allow_missing",
        help="embed the inputs that exist when some SOURCE_GLOB matches no file (by "
             "default that is an error naming it)"))
    min_items: int = field(default=DEFAULT_MIN_ITEMS, metadata=exposed(
        flag="--shards", job_key="shards", minimum=1,
        help="at least this many work items (default %(default)s), so small corpora spread "
             "over actors; each item is one shard=K folder"))
    item_tokens: int = field(default=DEFAULT_ITEM_TOKENS, metadata=exposed(
        flag="--item-tokens", job_key="item_tokens", minimum=1,
        metavar="N", help="target tokens per work item, estimated from input bytes "
                          "(default %(default)s)"))
    actors: int = field(default=1, metadata=exposed(
        flag="--actors", job_key="ray.actors", minimum=1,
        help="Ray actors each holding a model (default %(default)s)"))
    executor: str = field(default="auto", metadata=exposed(
        flag="--executor", job_key="ray.executor", choices=EXECUTORS,
        help="auto (default): Ray when --actors > 1, a GPU or --ray-address; else in-process"))
    ray_address: str | None = field(default=None, metadata=exposed(
        flag="--ray-address", job_key="ray.address", metavar="ADDR",
        help="existing Ray cluster to run on ('auto' on a cluster node)"))
    # How long to wait for a cluster to offer the actors' CPUs/GPUs (autoscaling clusters
    # add nodes for pending actors); 0: fail at once when it cannot hold them now.
    wait_for_resources_s: float = field(default=0.0, metadata=exposed(
        flag="--wait-for-resources", job_key="ray.wait_for_resources", minimum=0,
        metavar="SECONDS",
        help="how long to wait for the cluster to offer the actors' CPUs/GPUs (autoscaling "
             "clusters); default %(default)g: fail at once, naming what is missing"))
    cpus_per_actor: float | None = field(default=None, metadata=exposed(
        flag="--cpus-per-actor", job_key="ray.num_cpus", minimum=0, metavar="N",
        help="Ray CPUs per actor (default: the cluster's CPUs / --actors, or 1 with a GPU)"))
    gpus_per_actor: float | None = field(default=None, metadata=exposed(
        flag="--gpus-per-actor", job_key="ray.num_gpus", minimum=0, metavar="N",
        help="Ray GPUs per actor, a fraction to share one (default: 1 when --device cuda or "
             "the cluster has GPUs, 0 with --device cpu)"))
    cpu_workers: int | None = field(default=None, metadata=exposed(
        flag="--cpu-workers", job_key="ray.cpu_workers", minimum=0, metavar="N",
        help="item worker processes (read, tokenize, write) feeding each Ray actor's model "
             "(default: with a GPU, its node's cores per actor less the one that drives the "
             "GPU; 0 without one: each actor then works its own items, two at a time)"))
    dtype: str = field(default="int8", metadata=exposed(
        flag="--dtype", job_key="dtype", choices=STORAGE_DTYPES,
        help="storage dtype of the layers (default %(default)s): int8 (one float32 scale "
             "per vector, about half of float16's bytes), float16 (Spark cannot read it) "
             "or float32; docs/dataset_format.md"))
    device: str = field(default="auto", metadata=exposed(
        flag="--device", job_key="device", choices=DEVICES,
        help="where the model runs: auto (default: CUDA when the process or Ray actor has a "
             "GPU, else CPU), cpu (no GPU is requested from Ray), or cuda (each Ray actor "
             "requests one GPU)"))
    compute_dtype: str = field(default="float32", metadata=exposed(
        flag="--compute-dtype", job_key="compute_dtype", choices=COMPUTE_DTYPES,
        help="model arithmetic (default %(default)s); bfloat16 is faster on CPUs with bf16 "
             "matmuls, float16 needs --device cuda/auto on a GPU"))
    batch_tokens: int | None = field(default=None, metadata=exposed(
        flag="--batch-tokens", job_key="batch_tokens", minimum=1, metavar="N",
        help=f"token budget of one model batch (default: {DEFAULT_BATCH_TOKENS} on a CPU, "
             f"{GPU_BATCH_TOKENS} on a GPU)"))
    read: ReadOptions = field(default_factory=ReadOptions, metadata=exposed(
        custom=True, flag="(read flags)",
                                job_key="read", help="the fields of ReadOptions"))
    tokenizer: str | None = field(default=None, metadata=exposed(
        flag="--tokenizer", job_key="tokenizer", names=tokenizer_names, metavar="NAME",
        help="tokenizer (default: the one the model declares)"))
    max_sentence_tokens: int = field(default=DEFAULT_MAX_SENTENCE_TOKENS, metadata=exposed(
        flag="--max-sentence-tokens",
        job_key="max_sentence_tokens", minimum=2,
        help="longer sentences go through the model in windows (default %(default)s)"))
    window_overlap: int = field(default=DEFAULT_WINDOW_OVERLAP, metadata=exposed(
        flag="--window-overlap", job_key="window_overlap", minimum=0,
        help="tokens shared by consecutive windows (default %(default)s)"))
    part: str = field(default="main", metadata=exposed(
        flag="--part", not_in_job=_JOB_NAMES_PARTS,
        help="name of this part of the dataset"))
    repair: bool = field(default=False, metadata=exposed(
        flag="--repair", job_key="repair",
        help="first verify the part's committed items (as `elmo dataset verify`) and "
             "re-embed those whose files are missing, truncated or corrupt"))
    progress: bool = field(default=True, metadata=exposed(
        flag="--no-progress", help="no progress bar",
        not_in_job="how a run reports, not what it stores: `elmo jobs run --progress`"))
    unit_tokens: int | None = field(default=None, metadata=exposed(
        flag="--unit-tokens", job_key="unit_tokens", minimum=1, metavar="N",
        help="tokens per model call inside a work item (default: 4 x --batch-tokens on a "
             "CPU, --batch-tokens on a GPU)"))
    storage_options: dict | None = field(default=None, metadata=exposed(
        job_key="storage_options",
        not_on_cli="a nested mapping of fsspec options; on the command line fsspec reads "
                   "them from its config files and environment (e.g. FSSPEC_S3_ANON)"))
    # Embed only these files of ``sources`` (None: all of them). A URI string is looked up
    # in the listing of ``sources``; a SourceFile (from ``list_sources(sources)``) is used
    # as given, without listing again. Either way a file keeps the path relative to its
    # glob's fixed prefix, hence the same document ids as a run over the whole glob.
    source_files: tuple[SourceFile | str, ...] | None = field(default=None, metadata=exposed(
        not_on_cli="the globs name the files", not_in_job=_JOB_PICKS_FILES))

    def problems(self, name: Callable[[str], str] = flag_of) -> list[tuple[str, str]]:
        """``(field, reason)`` for every bad value; ``name`` turns a field (``read.format``
        for a read option) into what the reason calls it: a flag, or a job-spec key."""
        found: list[tuple[str, str]] = []
        for prefix, cls, holder in (("", EmbedConfig, self), ("read.", ReadOptions, self.read)):
            for f in settings_fields(cls):
                reason = None if f.setting.custom else value_problem(f, getattr(holder, f.name))
                if reason is not None:
                    found.append((f"{prefix}{f.name}", reason))
        bad = {path for path, _ in found}  # a rule across fields needs its fields' values
        if self.compute_dtype == "float16" and self.device == "cpu":
            found.append(("compute_dtype", "float16 compute needs a CUDA device; use "
                                           "bfloat16 on the CPU"))
        if (not bad & {"max_sentence_tokens", "window_overlap"}
                and self.window_overlap >= self.max_sentence_tokens):
            found.append(("window_overlap", f"must be below {name('max_sentence_tokens')} "
                                            f"({self.max_sentence_tokens})"))
        if "part" not in bad and ("/" in self.part or self.part.startswith(("_", "."))):
            found.append(("part", f"bad part name {self.part!r}"))
        if "ray_address" not in bad and (self.ray_address or "").startswith(
                ("http://", "https://")):
            found.append(("ray_address", "is the cluster address a run connects to (e.g. "
                                         "'auto' or 'ray://HEAD:10001'); the dashboard's "
                                         "http://HEAD:8265 is for `elmo jobs submit "
                                         "--address`"))
        if self.source_files is not None and not self.source_files:
            found.append(("source_files", "is empty: nothing to embed"))
        return found

    def model_call_sizes(self, on_gpu: bool) -> tuple[int, int]:
        """``(batch_tokens, unit_tokens)``, the defaults filled in for where the model runs.
        On a GPU a unit is one batch: a 131k-token unit of int8 layers would hold 400 MB
        in each item worker for each call in flight."""
        batch = self.batch_tokens or (GPU_BATCH_TOKENS if on_gpu else DEFAULT_BATCH_TOKENS)
        return batch, self.unit_tokens or (batch if on_gpu else 4 * batch)

    def validate(self) -> None:
        """Raise the first problem as a ``SettingError`` naming the setting to fix (the
        keyword a Python caller passes; the CLI renders it with its flag)."""
        for field_name, _ in self.problems():
            def render(name: Callable[[str], str], field_name: str = field_name) -> str:
                def named(path: str) -> str:
                    return name(path.removeprefix("read."))

                return f"{named(field_name)}: {dict(self.problems(named))[field_name]}"

            raise SettingError(field_name.removeprefix("read."), render)

    def select_sources(self) -> list[SourceFile]:
        """The files this run embeds, each with its path relative to its glob's prefix."""
        if self.source_files is None:
            return list_sources(self.sources, self.storage_options, self.allow_missing)
        given = [s for s in self.source_files if isinstance(s, SourceFile)]
        wanted = [s for s in self.source_files if not isinstance(s, SourceFile)]
        if wanted:
            listed = {s.uri: s for s in list_sources(self.sources, self.storage_options,
                                                     self.allow_missing)}
            by_path = {s.path: s for s in listed.values()}
            missing = [u for u in wanted if u not in listed and u not in by_path]
            if missing:
                raise ElmoUserError(f"source_files not matched by {' '.join(self.sources)}: "
                                    f"{', '.join(missing[:5])}")
            given += [listed.get(u) or by_path[u] for u in wanted]
        # Sorted and de-duplicated like list_sources: the plan and the ids do not depend
        # on the order the caller listed the files in.
        return sorted({s.uri: s for s in given}.values(), key=lambda s: s.uri)


class EmbedSettings(TypedDict, total=False):
    """``pipeline.embed``'s keyword settings, typed for editors and type checkers:
    ``EmbedConfig``'s fields (less ``sources``, ``out``, ``model``, ``read``) and
    ``ReadOptions``' fields, by the same names and types; a test holds the three equal."""

    min_items: int
    item_tokens: int
    actors: int
    executor: str
    ray_address: str | None
    wait_for_resources_s: float
    cpus_per_actor: float | None
    gpus_per_actor: float | None
    cpu_workers: int | None
    dtype: str
    device: str
    compute_dtype: str
    batch_tokens: int | None
    tokenizer: str | None
    max_sentence_tokens: int
    window_overlap: int
    part: str
    repair: bool
    allow_missing: bool
    progress: bool
    unit_tokens: int | None
    storage_options: dict | None
    source_files: tuple[SourceFile | str, ...] | None
    format: str
    doc_per: str
    pretokenized: bool
    text_column: str
    id_column: str
    tokens_column: str
