"""Senses: a word's occurrences in context, searched, clustered, counted and drawn."""
