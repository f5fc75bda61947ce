"""Sentence and document vectors: token vectors of a mix pooled per sentence or document,
stored as the derived tables ``sentence_vectors`` / ``document_vectors`` (``pooling``,
``store``) and searched by passage (``search``); ``cli`` holds ``elmo pool`` and
``elmo search passages``, ``routes`` the server's ``POST /passages/search``."""
