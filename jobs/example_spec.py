"""The annotated example spec shown by ``elmo jobs --help`` (no imports: --help stays fast)."""

EXAMPLE_SPEC = """\
# elmo job spec (TOML). Paths without a scheme are relative to this file.
name = "news"                          # default: the file name without extension
source = "s3://corpus/news/**/*.jsonl" # a glob URI, or a list of them
output = "s3://datasets/news"          # the dataset; job state lives in its _jobs/
model = "models/default"               # directory with options.json + weights
shards = 8                             # at least this many work items
item_tokens = 262144                   # target tokens per work item
# tokenizer = "moses"                  # default: the one the model declares
dtype = "int8"                         # or "float16", "float32"
compute_dtype = "float32"              # or "bfloat16" (faster on bf16 CPUs), "float16" (CUDA)
device = "auto"                        # or "cpu", "cuda"
schedule = "0 3 * * *"                 # cron, in `timezone` (default UTC)
timezone = "UTC"
delete_missing = false                 # remove rows of source files that disappeared
mixes = ["top", "average"]             # LanceDB indexes refreshed after each run
# index_out = "s3://datasets/news-index"   # default: <output>/_index
# index_compact = false                # keep vectors in the indexes (elmo index build --full)

[read]
format = "jsonl"

[ray]
address = "auto"                       # empty: in-process, or local Ray for actors > 1
actors = 4
num_gpus = 1                           # per actor
cpu_workers = 3                        # per actor: processes that read, tokenize, write
                                       # (default: the GPU node's cores per actor - 1)
wait_for_resources = 900               # seconds an autoscaling cluster gets to add nodes

[storage_options]                      # passed to fsspec for source and output
anon = false
"""
