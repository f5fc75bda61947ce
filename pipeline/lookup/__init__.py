"""The read path: everything that reads a dataset the write path (``pipeline/``) stored.

- ``dataset``: opening a dataset (``open_dataset``, ``open_fs``) and the one listing of
  the files readers read (``list_files``: the live view); stored mixes.
- ``mix_specs``: named layer mixes (top, average, layer:k, fitted ones): what a mix is.
- ``mixes``: mixes applied as layers are read (``iter_mixed``, ``mix_arrays``).
- ``parquet_layers``: the direct decoder of float16 layer columns ``iter_mixed`` uses.
- ``token_layers``: every layer as floats whatever the stored layout (schema v1-3: layer 0
  from the ``types`` files, int8 times its scale); ``read_tokens`` for small datasets.
- ``sql``: DuckDB views over a dataset plus the ``elmo_mix`` / ``elmo_cosine`` functions.
- ``index``: the LanceDB index of mixed token vectors (with word stems) for sense search.
- ``senses``: sense search (nearest occurrences of a word in context); re-exports the
  names of ``sense_hits`` (``Hit``: an occurrence with its document's fields) and
  ``sense_clusters`` (clustering, with written forms centred first).
- ``doc_fields``: document fields (source, metadata) and the filters on them.
- ``sense_tables``: a clustering counted by a document field, and exported as Parquet.
- ``sense_maps``: the clustering drawn as a PNG (matplotlib) and an HTML page (plotly).
- ``probe``: learned task weights (``elmo mix fit``).
- ``cli``: the ``elmo sql / index / senses / mix`` verbs (``senses_cli``: ``elmo senses``).

Nothing here writes to a dataset except ``elmo mix fit`` (its ``_mixes.json``); indexes
and maps go where the user says.
"""
