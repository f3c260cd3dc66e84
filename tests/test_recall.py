"""Recall from the chat log (layer 2 into the prompt), with the fake engine and a real DuckDB
file: what is recalled, where it goes, how it is counted, and that deleted turns never come
back."""

import pytest
from conftest import files_containing

from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.context.budget import RECALL_HEADER
from mlxmem.memory.recall import (
    MAX_QUERY_TERMS,
    RECALL_TURNS,
    SEED_POSTINGS,
    RecallQuery,
    asks_for,
    recall_query,
    refers_to_past,
    search_before,
)
from mlxmem.memory.store import Store
from mlxmem.memory.sync.synclog import SyncLog
from mlxmem.memory.tables import terms
from mlxmem.testing import FakeEngine

SECRET = "My grandmother's greenhouse in Tromso grows purple kohlrabi."


def responder(prompt: str) -> str:
    if "updated summary" in prompt:
        return "They chatted about daily things."
    return "Nice."


def chat_with_old_secret(budget=600, recall=True, filler=30):
    """A conversation whose first message (the secret) has long been folded into the summary."""
    engine = FakeEngine(responder)
    store = Store()
    settings = ChatSettings(recall=recall, extract_facts=False)
    companion = Companion(engine, store, "default", budget, 120, settings)
    companion.send(SECRET)
    for i in range(filler):
        companion.send(f"Day {i}: I walked to the bakery and bought bread number {i} today.")
    summary = store.latest_summary("default")
    assert summary is not None and summary.first_seq == 1  # the secret left the window
    return engine, store, companion


def test_query_and_cues():
    assert recall_query("What did I say about the greenhouses?").terms == ("greenhous",)
    # Words about the exchange itself are not searched for; endings are stripped.
    assert recall_query("Which paintings? Answer in a few words.").terms == ("paint",)
    assert refers_to_past("Do you remember my greenhouse")
    assert refers_to_past("where is it?")
    assert not refers_to_past("I baked bread today.")
    assert refers_to_past("Tell me what I said yesterday.")
    assert refers_to_past("Same as last Friday, and last weekend.")


def test_a_question_about_an_evicted_turn_recalls_it():
    engine, store, companion = chat_with_old_secret()
    question = "What grows in my grandmother's greenhouse?"
    unrecalled = ChatSettings(recall=False, extract_facts=False)
    plain = Companion(engine, store, "default", 600, 120, unrecalled).context(question)
    result = companion.send(question)
    secret = store.turns("default")[0]
    assert result.prompt.recalled[0] == secret.id
    newest = result.prompt.messages[-1].content
    assert newest.startswith(RECALL_HEADER) and "purple kohlrabi" in newest
    assert newest.endswith("What grows in my grandmother's greenhouse?")
    # Only the newest message carries it: the stable blocks before it are those the prompt
    # has without recall (the summary may name the secret too: it folded that turn).
    assert result.prompt.messages[:-1] == plain.messages[:-1]
    assert all("kohlrabi" not in m.content for m in result.prompt.messages[1:-1])
    # The log keeps the message as written.
    assert store.turns("default")[-2].text == "What grows in my grandmother's greenhouse?"


def test_recall_off_recalls_nothing():
    _, _, companion = chat_with_old_secret(recall=False)
    result = companion.send("What grows in my grandmother's greenhouse?")
    assert result.prompt.recalled == [] and result.prompt.layers.recall == 0


def test_recall_is_counted_exactly_and_the_budget_holds():
    engine, _, companion = chat_with_old_secret()
    result = companion.send("What grows in my grandmother's greenhouse?")
    layers = result.prompt.layers
    assert layers.recall > 0
    assert sum(layers.to_dict().values()) == 600
    assert len(result.prompt.tokens) + layers.reserve <= 600
    call = engine.calls[-1]
    assert call.prompt_tokens + call.max_tokens <= 600
    # Exactly the tokens the block added to the prompt.
    without = companion.context()  # the same state, no new message
    assert layers.turns + layers.recall + layers.summary + layers.facts + layers.instructions == (
        len(result.prompt.tokens)
    )
    assert without.layers.recall == 0


def test_context_preview_shows_the_recall_layer():
    _, _, companion = chat_with_old_secret()
    preview = companion.context("Remember the greenhouse?")
    assert preview.layers.recall > 0 and sum(preview.layers.to_dict().values()) == 600
    assert companion.context().layers.recall == 0


def test_a_recalled_turn_keeps_the_prefix_cached():
    engine, _, companion = chat_with_old_secret()
    companion.send("A plain message with no question in it at all.")
    first = companion.send("What grows in my grandmother's greenhouse?")
    # The recall block sits inside the new message: everything before it came from the cache.
    newest = engine.count_chat(first.prompt.messages[-1:], True) - 1  # without <bos>
    assert first.stats.prefilled_tokens <= newest + 1
    assert first.warm_prefilled_tokens > 0  # the block is taken out of the cache after the reply
    second = companion.send("Tell me again, what grows in that greenhouse?")
    newest = engine.count_chat(second.prompt.messages[-1:], True) - 1
    assert second.stats.prefilled_tokens <= newest + 1


def test_a_deleted_turn_is_never_recalled():
    _, store, companion = chat_with_old_secret()
    secret = store.turns("default")[0]
    store.delete_turns([secret.id])
    result = companion.send("What grows in my grandmother's greenhouse?")
    assert secret.id not in result.prompt.recalled
    assert all("kohlrabi" not in m.content for m in result.prompt.messages)


def bulk_log(con, turns: int, text: str = "'I walked the dog and had bread number ' || i"):
    """Conversation "big": `turns` user turns written in one statement, their text the SQL
    expression `text` of the turn's number i, not indexed yet (a bulk load)."""
    con.execute("INSERT INTO conversations (name, created_at) VALUES ('big', now())")
    con.execute(
        "INSERT INTO turns (conversation_id, seq, role, text, created_at)"
        f" SELECT 1, i, 'user', {text}, now() FROM range(1, ? + 1) t(i)",
        [turns],
    )


def test_bm25_ranks_the_rare_word_first(tmp_path):
    store = Store(tmp_path / "big.duckdb")
    with store.connect() as con:
        bulk_log(con, 2000)
        con.execute(  # first person, as the others are: the prior favours neither
            "UPDATE turns SET text = 'my kohlrabi in the greenhouse is purple' WHERE seq = 77"
        )
        assert terms.index_missing(con) == 2000  # a bulk load, indexed after the fact
        found = search_before(con, "big", 2000, recall_query("purple bread greenhouse?"))
    assert found[0].seq == 77
    assert len(found) == RECALL_TURNS  # speed: benchmarks/recall_retrieval.py --scale


def test_a_search_of_common_words_only_scores_their_latest_turns(tmp_path):
    # Every turn holds both words, more than SEED_POSTINGS of them: the turns scored are the
    # SEED_POSTINGS logged last (and their neighbours), the best of them first; an older turn
    # where the words count more is beyond the limit.
    store = Store(tmp_path / "common.duckdb")
    turns = SEED_POSTINGS + 500
    with store.connect() as con:
        bulk_log(con, turns)
        con.execute(
            "UPDATE turns SET text = 'Bread, bread and more bread: I walked to get bread.'"
            " WHERE seq IN (5, ?, ?)",
            [turns - 40, turns - 400],
        )
        terms.index_missing(con)
        found = search_before(con, "big", turns, recall_query("walk bread?"))
        con.execute("UPDATE turns SET text = text || ' Sourdough.' WHERE seq = 5")
        terms.reindex(con)
        rare = search_before(con, "big", turns, recall_query("walk bread sourdough?"))
    assert {t.seq for t in found[:2]} == {turns - 40, turns - 400}
    assert 5 not in {t.seq for t in found}
    assert rare[0].seq == 5  # a rarer word seeds it


def test_a_pasted_text_searches_for_its_first_and_last_terms_only():
    words = [f"w{i}x" for i in range(500)]
    query = recall_query("Where did we leave " + " ".join(words) + " the kohlrabi?")
    assert len(query.terms) == MAX_QUERY_TERMS and query.asks == "name"  # what "where" asks for
    assert query.terms[0] == "leav" and query.terms[-1] == "kohlrabi"
    pasted = recall_query("(You are Mel; I am Jo.) " + " ".join(words) + " Mel?")
    assert pasted.speakers == ("assistant",)


def test_the_stemmer_is_snowball_english():
    words = "paintings painting painted paints paint adopted adoption stories story runs".split()
    stems = [terms.stem(w) for w in words]
    assert stems[:5] == ["paint"] * 5
    assert stems[5] == stems[6] and stems[7] == stems[8] and stems[9] == "run"
    assert not recall_query("What was answered? Did I remember?")  # stopwords, once stemmed
    assert terms.terms("Tromsø, Tromsø and the 2023 café!") == ["tromsø", "tromsø", "2023", "café"]


def test_a_word_meets_its_other_forms_in_the_log(tmp_path):
    store = Store(tmp_path / "forms.duckdb")
    for text in ["I was painting the shed all weekend.", "Lunch was soup.", "Rain again."]:
        store.append_turn("c", "user", text)
    with store.connect() as con:
        found = search_before(con, "c", 3, recall_query("Which paints did I use?"))
        assert [t.seq for t in found][:2] == [1, 2]  # the match, then the turn after it
        assert search_before(con, "c", 3, recall_query("The soups?"))[0].seq == 2


def test_a_word_meets_the_words_it_begins_with_and_those_that_begin_with_it(tmp_path):
    store = Store(tmp_path / "related.duckdb")
    for text in ["A mentor helped me.", "Lunch was soup.", "She is a painter.", "Rain again."]:
        store.append_turn("c", "user", text)
    with store.connect() as con:
        # The turn and its reply; no passage: passages are of the words asked only.
        assert [t.seq for t in search_before(con, "c", 4, recall_query("Any mentorship?"))] == [
            1,
            2,
        ]
        assert search_before(con, "c", 4, recall_query("Any paintings?"))[0].seq == 3
        # A short word (under four letters) meets only itself: "soup" is not "so".
        assert [t.seq for t in search_before(con, "c", 4, ["so"])] == []
        # Nor does a long one (a pasted blob: each of its prefixes would be a term).
        assert search_before(con, "c", 4, recall_query("lunc" + "h" * 60 + "?")) == []


def test_a_related_word_counts_less_than_the_word_itself(tmp_path):
    store = Store(tmp_path / "related.duckdb")
    # The second also gets half the first's score, as its reply: at more than half a match
    # for a related word, it would come first.
    for text in ["Her mentorship helped.", "Her mentor helped.", "Rain again.", "Cold today."]:
        store.append_turn("c", "user", text)
    with store.connect() as con:
        assert search_before(con, "c", 4, recall_query("Any mentorship?"))[0].seq == 1


@pytest.mark.parametrize(
    ("question", "kind"),
    [
        ("(You are Mel; I am Jo.) Question: When did we bake?", "when"),
        ("How long ago was it?", "when"),
        ("How many dogs? And how long has she had them?", "number"),
        ("Where did we go?", "name"),
        ("Who called. What is the name of her cat?", "name"),
        ("What did we bake? Why?", None),
        ("Is whenever fine?", None),
        # In the question, in its last clause that starts with a question word:
        ("When I was a kid, what did I love to eat?", None),
        ("When did you go, and with whom?", "when"),
        ("Who cares. What did I bake last week?", None),
        ("Sure, so when did we meet?", "when"),
        ("According to Jo, who is the best cook?", "name"),
    ],
)
def test_what_a_question_asks_for(question, kind):
    assert asks_for(question) == kind


@pytest.mark.parametrize(
    ("question", "holds", "lacks"),
    [
        ("When did we bake rye bread?", "on Friday", "on purpose"),
        ("How many times did we bake rye bread?", "twice", "gladly"),
        ("Where did we bake rye bread?", "in Lisbon", "in haste"),
    ],
)
def test_a_turn_that_holds_what_the_question_asks_for_ranks_first(tmp_path, question, holds, lacks):
    store = Store(tmp_path / "asks.duckdb")
    for words in (holds, lacks):  # alike but for what the question asks for
        store.append_turn("c", "user", f"We baked rye bread {words}.")
    with store.connect() as con:
        found = search_before(con, "c", 2, recall_query("Why did we bake rye bread?"))
        assert [t.seq for t in found] == [2, 1]  # a tie: the later first
        assert [t.seq for t in search_before(con, "c", 2, recall_query(question))] == [1, 2]


def test_of_two_close_matches_the_turn_that_tells_of_its_speaker_ranks_first(tmp_path):
    # The prior moves a turn a place or two among close matches, not ahead of a strong one:
    # ten strong matches first, then two alike but for who they speak of. Four turns apart,
    # so that no passage or reply holds two of them.
    store = Store(tmp_path / "self.duckdb")
    filler = ["Rain again.", "Lunch was soup.", "The bus was late.", "Cold today."]
    texts = [*["Rye bread with love, rye bread with love.", *filler] * 10]
    texts += ["I love rye bread, truly.", *filler, "You love rye bread, truly.", *filler]
    for text in texts:
        store.append_turn("c", "user", text)
    with store.connect() as con:
        found = search_before(con, "c", len(texts), recall_query("Does anyone love rye bread?"), 12)
    strong = {1 + 5 * i for i in range(10)}
    assert {t.seq for t in found[:10]} == strong
    alike = [t.text for t in found[10:] if "love" in t.text]
    # Without the prior the later would be first, as their tie is broken.
    assert alike == ["I love rye bread, truly.", "You love rye bread, truly."]


def index_rows(con, turn_id: int) -> list[tuple]:
    return con.execute(
        "SELECT term FROM recall_terms WHERE turn_id = ? UNION ALL"
        " SELECT 'length' FROM recall_docs WHERE turn_id = ?",
        [turn_id, turn_id],
    ).fetchall()


def test_turns_are_indexed_at_insert_and_their_terms_erased_with_them(mlxmem_home):
    store = Store()
    for i in range(40):  # enough rows that the index lands in checkpointed blocks
        store.append_turn("c", "user", f"Filler message number {i} about the weather.")
    secret = store.append_turn("c", "user", "The zyxquorbitals glimmered over Vardø fjord.")
    store.append_turn("c", "assistant", "How lovely.")
    stem = terms.stem("zyxquorbitals")
    assert stem != "zyxquorbitals"  # the index holds the stem, not the word
    with store.connect() as con:
        assert ("length",) in index_rows(con, secret.id)
        assert (stem,) in index_rows(con, secret.id)
        assert vocabulary(con)[stem][0] == 1  # the vocabulary holds the stem too
        assert search_before(con, "c", 42, [stem])[0].id == secret.id
    with store.connect() as con:
        con.execute("CHECKPOINT")
    assert files_containing(mlxmem_home, stem)  # not vacuous: the index is on disk

    store.delete_turns([secret.id])
    with store.connect() as con:
        assert index_rows(con, secret.id) == []
        assert stem not in vocabulary(con)
        assert con.execute("SELECT count(*) FROM recall_docs").fetchone() == (41,)
        assert search_before(con, "c", 42, [stem]) == []
    for word in (stem, "Vardø".lower(), "glimmer"):
        assert files_containing(mlxmem_home, word) == [], word


def vocabulary(con) -> dict[str, tuple[int, int, int]]:
    rows = con.execute("SELECT term, df, first_id, last_id FROM recall_vocab").fetchall()
    return {term: tuple(rest) for term, *rest in rows}


def assert_vocabulary_counts_the_index(con) -> None:
    """Each term's count is its index rows', and its bounds their first and last ids: no
    bound is a deleted message's id."""
    counted = con.execute(
        "SELECT term, count(*), min(turn_id), max(turn_id) FROM recall_terms GROUP BY term"
    ).fetchall()
    assert vocabulary(con) == {term: tuple(rest) for term, *rest in counted}


def test_the_vocabulary_counts_what_the_index_holds_through_every_change(tmp_path):
    here, there = Store(tmp_path / "a" / "mlxmem.duckdb"), Store(tmp_path / "b" / "mlxmem.duckdb")
    mine, theirs = SyncLog(here.path), SyncLog(there.path)
    gone = [here.append_turn("c", "user", f"Alpacas and llamas, day {i}.") for i in range(3)]
    here.append_turn("d", "user", "A diary of llamas and quinoa.")
    here.append_turn("c", "assistant", "Alpacas again!")
    there.append_turn("c", "user", "Quinoa with alpacas near Arequipa.")
    mine.merge(theirs.changes())
    here.delete_turns([gone[0].id])
    here.delete_conversation("d")
    with here.connect() as con:
        assert vocabulary(con)["alpaca"][0] == 4
        assert vocabulary(con)["alpaca"][1] == gone[1].id  # the deleted first holder is gone
        assert "quinoa" in vocabulary(con)  # still in the merged turn
        assert_vocabulary_counts_the_index(con)
    # One merge that deletes a word's last turn here and brings a new turn holding it.
    there.delete_turns([1])
    there.append_turn("c", "user", "Arequipa once more, with quinoa.")
    mine.merge(theirs.changes())
    with here.connect() as con:
        assert_vocabulary_counts_the_index(con)
        assert vocabulary(con)["quinoa"][0] == 1
        terms.reindex(con)
        assert_vocabulary_counts_the_index(con)


def test_a_word_said_mostly_long_ago_seeds_with_its_newest_turns(tmp_path):
    # "bread" in each of the first 3,000 turns and once at the end: its newest SEED_POSTINGS
    # rows lie mostly far back, beyond the stretch an even spread would put them in.
    store = Store(tmp_path / "old.duckdb")
    with store.connect() as con:
        early = "CASE WHEN i <= 3000 THEN 'I had bread number ' ELSE 'Rain number ' END || i"
        bulk_log(con, 10000, early)
        con.execute(
            "UPDATE turns SET text = 'Bread, bread and more bread, I had bread.'"
            " WHERE seq IN (5, 2990)"
        )
        con.execute("UPDATE turns SET text = 'Rain and rye bread.' WHERE seq = 10000")
        terms.index_missing(con)
        found = search_before(con, "big", 10000, recall_query("Which bread was it?"))
    assert found[0].seq == 2990  # among the newest rows of the word, read in full
    assert 5 not in {t.seq for t in found}  # beyond the limit


def test_a_whole_conversation_leaves_no_index_rows(mlxmem_home):
    store = Store()
    store.append_turn("diary", "user", "Qwertyplinths everywhere")
    store.append_turn("other", "user", "Something else entirely")
    store.delete_conversation("diary")
    with store.connect() as con:
        assert con.execute("SELECT count(*) FROM recall_docs").fetchone() == (1,)
        assert con.execute(
            "SELECT count(*) FROM recall_terms WHERE term LIKE 'qwerty%'"
        ).fetchone() == (0,)
    assert files_containing(mlxmem_home, "qwertyplinth") == []


def test_turns_merged_from_another_device_are_indexed_and_recalled(tmp_path):
    here, there = Store(tmp_path / "a" / "mlxmem.duckdb"), Store(tmp_path / "b" / "mlxmem.duckdb")
    there.append_turn("c", "user", "My aunt keeps alpacas near Arequipa.")
    there.append_turn("c", "assistant", "Alpacas! How many?")
    here.append_turn("c", "user", "Morning, just had coffee.")
    assert SyncLog(here.path).merge(SyncLog(there.path).changes()).turns == 2
    with here.connect() as con:
        counts = con.execute(
            "SELECT count(*) FROM turns UNION ALL SELECT count(*) FROM recall_docs"
        )
        assert [n for (n,) in counts.fetchall()] == [3, 3]
        found = search_before(con, "c", 3, recall_query("Where are the alpacas?"))
    assert {t.text for t in found} == {"Alpacas! How many?", "My aunt keeps alpacas near Arequipa."}


def test_a_message_that_says_who_is_who_asks_for_a_speakers_turns():
    probe = "(You are Melanie; I am Caroline.) Question: What did Caroline research?"
    assert recall_query(probe) == RecallQuery(("research",), ("user",))
    mel = recall_query("You're Mel and I'm Jo. What did Mel bake?")
    assert mel == RecallQuery(("bake",), ("assistant",)) and mel.speaker == "assistant"
    # Both named: both speakers, neither asked about; a name never said to be a speaker: a word.
    both = recall_query("(You are Mel; I am Jo.) What do Jo and Mel share?")
    assert both == RecallQuery(("share",), ("user", "assistant")) and both.speaker is None
    assert recall_query("I am tired. What did Anna say?") == RecallQuery(("tire", "anna"))


def test_the_named_speakers_turn_and_the_reply_to_a_match_rank_first(tmp_path):
    store = Store(tmp_path / "speakers.duckdb")
    turns = [
        ("user", "Which team did you sign with, Mel?"),
        ("assistant", "The Lakers! I play as shooting guard."),
        ("user", "I once watched a basketball team play in Lisbon."),
        ("assistant", "My basketball team practices on Mondays."),
    ]
    for role, text in turns:
        store.append_turn("c", role, text)
    with store.connect() as con:
        # The reply to the matching question ranks first, though it has no query word; the
        # question itself, which asks and tells nothing, after the turns that tell (recall's
        # prior: four turns are close matches all).
        found = [
            t.seq for t in search_before(con, "c", 4, recall_query("Which team did Mel sign with?"))
        ]
        assert found == [2, 4, 3, 1]
        # Asked about the assistant's team: the assistant's turn first, the user's after.
        found = search_before(
            con, "c", 4, recall_query("(You are Mel; I am Jo.) Mel's basketball team?")
        )
        assert [t.seq for t in found][:2] == [4, 3]
        found = search_before(
            con, "c", 4, recall_query("(You are Mel; I am Jo.) Jo's basketball team?")
        )
        assert found[0].seq == 3
