"""``elmo serve``: the feature store over HTTP, with a sense explorer page.

One long-lived process loads the dataset's model and opens the dataset and its sense
indexes once; requests then cost milliseconds instead of a new process each
(docs/serving.md). ``app.py`` holds the FastAPI routes, ``resources.py`` what they read,
``batching.py`` gathers concurrent sense searches into one model call and one LanceDB
search, ``sql_guard.py`` runs user SQL on a locked-down DuckDB connection, ``sql_worker.py`` runs
that connection in a process of its own under a memory cap, and
``static/`` is the explorer page.
"""
