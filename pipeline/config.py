"""What an embedding run is asked to do: the model, the inputs, the output, the executor.

``EmbedConfig`` is the Python API of ``elmo embed`` (the CLI builds one from its flags);
``validate`` turns every bad value into an ``ElmoUserError`` naming the flag to fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from elmo_model.errors import ElmoUserError
from pipeline.sources import FORMATS, ReadOptions, SourceFile, list_sources

DEFAULT_SHARDS = 8  # at least this many work items (small corpora still spread over actors)
DEFAULT_ITEM_TOKENS = 262_144  # target tokens per work item, estimated from input bytes
DEFAULT_BATCH_TOKENS = 4096
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
        import elmo_model

        if options or weights:
            if not (options and weights):
                raise ElmoUserError("--options and --weights go together; give both or --model")
            for path in (options, weights):
                if not Path(path).is_file():
                    raise ElmoUserError(f"model file not found: {path}")
            return cls(str(Path(options).resolve()), str(Path(weights).resolve()))
        from elmo_model.weights import model_dir_files

        directory = Path(model_dir) if model_dir else elmo_model.default_model_dir()
        if model_dir is None and not (directory / elmo_model.OPTIONS_FILE).is_file():
            raise ElmoUserError(f"no bundled model in {directory} yet; pass --model DIR "
                                "or --options FILE --weights FILE")
        options_path, weights_path = model_dir_files(directory)
        return cls(str(options_path.resolve()), str(weights_path.resolve()))


@dataclass(frozen=True)
class EmbedConfig:
    sources: list[str]
    out: str
    model: ModelSpec
    n_shards: int = DEFAULT_SHARDS  # minimum number of work items (see pipeline/plan.py)
    item_tokens: int = DEFAULT_ITEM_TOKENS  # target tokens per work item
    actors: int = 1
    dtype: str = "float16"  # storage dtype of the layer columns
    batch_tokens: int = DEFAULT_BATCH_TOKENS
    executor: str = "auto"  # auto: Ray when actors > 1, a GPU, or a Ray address; else local
    tokenizer: str | None = None  # None: the tokenizer the model declares
    max_sentence_tokens: int = DEFAULT_MAX_SENTENCE_TOKENS
    window_overlap: int = DEFAULT_WINDOW_OVERLAP
    read: ReadOptions = field(default_factory=ReadOptions)
    part: str = "main"
    progress: bool = True
    storage_options: dict | None = None
    cpus_per_actor: float | None = None
    gpus_per_actor: float | None = None
    ray_address: str | None = None
    # How long to wait for a cluster to offer the actors' CPUs/GPUs (autoscaling clusters
    # add nodes for pending actors); 0: fail at once when it cannot hold them now.
    wait_for_resources_s: float = 0.0
    unit_tokens: int | None = None  # tokens per model call inside an item; default 4 x batch
    compute_dtype: str = "float32"  # model arithmetic: float32, bfloat16, float16 (CUDA only)
    device: str = "auto"  # auto: CUDA when the process (actor) has a GPU, else CPU
    # Embed only these files of ``sources`` (None: all of them). A URI string is looked up
    # in the listing of ``sources``; a SourceFile (from ``list_sources(sources)``) is used
    # as given, without listing again. Either way a file keeps the path relative to its
    # glob's fixed prefix, hence the same document ids as a run over the whole glob.
    source_files: tuple[SourceFile | str, ...] | None = None
    # Test hook: the first Ray actor call that finds no file at this path creates it and
    # kills its own process, to check that Ray restarts the actor and retries the item.
    crash_marker: str | None = None

    def validate(self) -> None:
        if self.n_shards < 1:
            raise ElmoUserError("--shards must be at least 1")
        if self.item_tokens < 1:
            raise ElmoUserError("--item-tokens must be at least 1")
        if self.actors < 1:
            raise ElmoUserError("--actors must be at least 1")
        if self.dtype not in ("float16", "float32"):
            raise ElmoUserError(f"--dtype must be float16 or float32, not {self.dtype!r}")
        if self.batch_tokens < 1:
            raise ElmoUserError("--batch-tokens must be at least 1")
        if self.executor not in EXECUTORS:
            raise ElmoUserError(f"--executor must be one of {', '.join(EXECUTORS)}")
        if self.max_sentence_tokens < 2 or not 0 <= self.window_overlap < self.max_sentence_tokens:
            raise ElmoUserError("need --max-sentence-tokens >= 2 and 0 <= --window-overlap < it")
        if not self.part or "/" in self.part or self.part.startswith(("_", ".")):
            raise ElmoUserError(f"bad part name {self.part!r}")
        if self.device not in DEVICES:
            raise ElmoUserError(f"--device must be one of {', '.join(DEVICES)}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ElmoUserError(f"--compute-dtype must be one of {', '.join(COMPUTE_DTYPES)}")
        if self.compute_dtype == "float16" and self.device == "cpu":
            raise ElmoUserError("--compute-dtype float16 needs CUDA; on the CPU use bfloat16")
        if self.wait_for_resources_s < 0:
            raise ElmoUserError("--wait-for-resources must be 0 or more seconds")
        if self.read.format not in FORMATS:
            raise ElmoUserError(f"unknown --format {self.read.format!r}; use one of "
                                f"{', '.join(FORMATS)}")
        if self.read.doc_per not in ("line", "file"):
            raise ElmoUserError(f"--doc-per must be 'line' or 'file', not {self.read.doc_per!r}")
        if self.source_files is not None and not self.source_files:
            raise ElmoUserError("source_files is empty: nothing to embed")

    def select_sources(self) -> list[SourceFile]:
        """The files this run embeds, each with its path relative to its glob's prefix."""
        if self.source_files is None:
            return list_sources(self.sources, self.storage_options)
        given = [s for s in self.source_files if isinstance(s, SourceFile)]
        wanted = [s for s in self.source_files if not isinstance(s, SourceFile)]
        if wanted:
            listed = {s.uri: s for s in list_sources(self.sources, self.storage_options)}
            by_path = {s.path: s for s in listed.values()}
            missing = [u for u in wanted if u not in listed and u not in by_path]
            if missing:
                raise ElmoUserError(f"source_files not matched by {' '.join(self.sources)}: "
                                    f"{', '.join(missing[:5])}")
            given += [listed.get(u) or by_path[u] for u in wanted]
        # Sorted and de-duplicated like list_sources: the plan and the ids do not depend
        # on the order the caller listed the files in.
        return sorted({s.uri: s for s in given}.values(), key=lambda s: s.uri)
