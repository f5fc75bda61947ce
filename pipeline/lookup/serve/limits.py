"""What one request may ask of the server: every bound the routes and the page check."""

from __future__ import annotations

MAX_BODY_BYTES = 256 * 1024  # a request body; larger ones get 413 before they are read
MAX_SENTENCES = 64  # per /embed request
MAX_SENTENCE_CHARS = 2_000  # per sentence (embed and search)
# Tokens per /embed request: its answer holds a vector per token as JSON (about 11 kB a
# token at 512 values), so 64 sentences of 660 tokens made a 452 MB answer; this bounds
# one answer at about 45 MB (512-d) and still takes any one sentence whole.
MAX_EMBED_TOKENS = 4_096
MAX_K = 200  # neighbours per sense search
MAX_OCCURRENCE = 100  # which occurrence of the word in the query sentence
MAX_CLUSTERS = 8  # k of /senses/{word}; "auto" tries 2..this
MAX_PAGE = 1_000  # rows per /occurrences page
MAX_CONTEXT = 20  # sentences either side in /sentences
MAX_FILTERS = 16  # document-field filters per search
MAX_WORD_CHARS = 100

# Sentences whose layers are kept: the embedder is stateless, so a sentence asked again
# (the explorer page asks for its words, then searches each clicked word) needs no model run.
LAYER_CACHE_SENTENCES = 1_024
LAYER_CACHE_BYTES = 64 * 1024 * 1024  # and at most this much of them (long sentences)
# A word whose candidate rows hold at most this many floats (32k rows of 256-d) is searched
# exactly in this process, over its rows kept in memory: one matrix-vector product. Its cost
# grows with the rows and meets a prefiltered vector-index search's at about three times
# this (docs/serving.md); the bound also keeps the cache to a few such words.
EXACT_CANDIDATE_VALUES = 1 << 23
EXACT_CACHE_VALUES = 1 << 25  # floats kept for all such words together (128 MB of float32)

# Batching: a search waits at most this long for others to share its model call.
BATCH_WINDOW_S = 0.003
MAX_BATCH = 32

SQL_TIMEOUT_S = 10.0  # a query running longer is interrupted
SQL_MAX_ROWS = 10_000  # rows returned; the answer says when more were cut
SQL_MAX_RESULT_BYTES = 32 * 1024 * 1024  # Arrow bytes of those rows; more is refused
MAX_SQL_CHARS = 20_000
# Memory a /sql query may take (``elmo serve --sql-memory``): the SQL worker process may
# grow this far past its idle size (RLIMIT_DATA, sql_worker.py); DuckDB's own buffer
# manager gets half of it (its default is 80% of the machine's) and spills nothing, so a
# large join or sort stops there with DuckDB's error, and what DuckDB does not count
# (huge strings and lists a function builds) meets the process's cap.
SQL_MEMORY_MB = 1024
MIN_SQL_MEMORY_MB = 128  # below this the worker cannot run a query and hold its answer
# The JSON of one /sql answer, written by the worker: all of a /sql answer the server holds.
SQL_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
# A query that does not stop this long after its time limit interrupted it (or a worker
# that does not answer) is killed with its worker.
SQL_KILL_GRACE_S = 5.0
SQL_WORKER_START_S = 120.0  # a (re)started worker opens the dataset within this
