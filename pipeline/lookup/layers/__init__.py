"""Stored layers read as numbers and mixed on read (float16, int8, layer 0 per type)."""
