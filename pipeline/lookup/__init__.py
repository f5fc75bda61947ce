"""The read path: mix layers on read, SQL over a dataset, the vector index, senses, probes.

``pipeline/`` writes datasets; this package only reads them (and the index it builds).
"""
