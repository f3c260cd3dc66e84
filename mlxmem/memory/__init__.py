"""The three memory layers: the prompt window (window, budget, recall), the chat log and the
facts in one store (db, migrations, turns, summaries, facts, store), what derives from them
(extraction), and the store's side of a sync (records, merge).

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
