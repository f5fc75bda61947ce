"""The write path: a corpus in, every layer of every token stored (plan, read, tokenize,
work items on executors, item files, commit)."""
