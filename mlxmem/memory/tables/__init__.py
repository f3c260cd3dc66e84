"""Layers 2 and 3 as stored: every table's owner, at the bottom of mlxmem.memory.

One DuckDB file holds the chat log (`conversations`, `turns`, recall's index `recall_*`, the
rolling `summaries`, the `tombstones` of deletions, the `state` of this device) and attaches the
facts file (`facts`, `fact_counter`); the bench's runs have a file of their own (`bench_runs`).
Each table is written by one module here, and only there: db (the connection, its locks, the
erase protocol and `state`), migrations (the schema, numbered), turns (`conversations`,
`turns`), terms (recall's index), facts, summaries, tombstones and runs. rows and dates are the
small helpers they share. Nothing here imports from the folders above it.
"""
