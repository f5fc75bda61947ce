"""The corpus recipe for the next default model: fetch public text with the registries'
own clients, keep its prose, drop near-duplicate paragraphs, split held-out documents off
by content hash and write JSONL with a manifest.

Run ``python -m elmo_model.corpus build --out DIR``; modules: ``sources`` (packages,
versions, licences, fetching), ``extract`` (prose out of HTML, JSON and text), ``dedup``,
``split`` (the held-out rule, shared with ``elmo train``) and ``build`` (JSONL + manifest).
This package imports nothing heavy: ``elmo train`` imports its held-out rule.
"""
