"""The three memory layers, laid out by role; each folder imports only from itself and below:

- `tables/`: every table's owner, layers 2 (the chat log: turns, conversations, recall's index,
  summaries, tombstones) and 3 (facts) as stored in one DuckDB file; each table is written by
  its owner module only;
- `context/`: layer 1, the model's context: the budgeted prompt, the extractive summary and the
  checks of a model's summary, the speakers' names;
- here: what works across them: recall (layer 2 into the prompt), extraction (layer 3 from
  turns), forget (a deletion's cascade), store (the Store, one call per thing a front end
  does), window (the verbatim turns and their fold into the summary) and the turn itself
  (companion, with prompt, looks and turn; sessions keeps one open per conversation);
- `sync/`: the store's side of a sync, above the forgetting it shares with local deletions.

The words, one per concept:
- a *turn* (`Turn`) is one logged message of the person or the model, a row of the table
  `turns`; its `seq` numbers it within its conversation (the sync format keeps the name
  "message" for it, which older devices read);
- a *message* (`engine.Message`) is one entry of an assembled prompt (system, user or
  assistant), made from turns, facts and the summary: never stored;
- a *fact* (`Fact`, table `facts`) is one line of "memory about you", `manual` or `automatic`;
- a *summary* (`Summary`, table `summaries`) folds the turns up to its `last_seq`;
- a *record* (`records.Record`) is a turn, a fact version or a tombstone as it travels
  between devices or into an export file.
"""
