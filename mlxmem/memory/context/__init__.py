"""Layer 1, the model's context: what a prompt is made of and how it fits its budget.

budget packs instructions, facts, the rolling summary, the verbatim turns and recalled turns
into a prompt whose exact token count fits; extractive writes a summary from the turns' own
sentences, summary_check and summary_words check a model's summary against the turns it
folds, speakers names who said what. These read the tables' row types (mlxmem.memory.tables)
and write none: the prompt is rebuilt for every model call and is never the source of truth.
"""
