"""The read path: everything that reads a dataset the write path (``pipeline/write/``)
stored. Opening a dataset and its live view are the storage contract's
(``schemas/dataset.py``, ``schemas/manifest.py``), as are stored mixes
(``schemas/mix_specs.py``). ``api`` holds what ``pipeline.open_dataset`` and
``pipeline.open_index`` return.

- ``layers``: stored layers read as numbers and mixed on read (``mixes``: ``iter_mixed``,
  ``mix_arrays``; ``parquet``: the direct decoder of float16 layer columns; ``int8``;
  ``tokens``: every layer as floats whatever the stored layout, schema v1-3: layer 0
  from the ``types`` files, int8 times its scale; ``probe``: learned task weights,
  ``elmo mix fit``).
- ``sql``: DuckDB views over a dataset plus the ``elmo_mix`` / ``elmo_cosine`` functions.
- ``doc_fields``: document fields (source, metadata) and the filters on them.
- ``index``: the LanceDB index of mixed token vectors (with word stems) for sense search.
- ``senses``: sense search (``search``: nearest occurrences of a word in context; ``hits``:
  an occurrence with its document's fields; ``clusters``: clustering, with written forms
  centred first; ``tables``: a clustering counted by a document field and exported as
  Parquet; ``maps``: the clustering drawn as a PNG and an HTML page; ``cli``: ``elmo
  senses``).
- ``serve``: ``elmo serve``, the HTTP API and the sense explorer page.
- ``cli``: the ``elmo sql / index / mix`` verbs.

Nothing here writes to a dataset except ``elmo mix fit`` (its ``_mixes.json``); indexes
and maps go where the user says.
"""
