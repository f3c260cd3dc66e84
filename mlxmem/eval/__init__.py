"""Measuring what the memory remembers, beside the core: `locomo` replays LoCoMo's long
conversations through the memory layers and asks their questions (`mlxmem eval locomo`)."""
