"""Recall's query is a value: what a message asks for (its terms, the speakers and days it
names, what its question asks), read by one function and searched by another, through the
companion and the store. Fake engine and real DuckDB files; the messages are made up."""

import dataclasses
from datetime import date, datetime, timezone

import pytest

from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.recall import MAX_DAY_RANGES, RecallQuery, recall_query, search_before
from mlxmem.memory.store import Store
from mlxmem.testing import FakeEngine

ASKED = "You are Mel; I am Jo. When did Mel paint the red kayak last week?"


def test_a_message_is_read_into_one_query():
    query = recall_query(ASKED, today=date(2023, 5, 17))
    assert query == RecallQuery(
        terms=("paint", "red", "kayak", "week"),
        speakers=("assistant",),
        days=((date(2023, 5, 3), date(2023, 5, 17)),),
        asks="when",
    )
    assert query.speaker == "assistant"
    # Without the day it is written, no day is read from "last week".
    assert recall_query(ASKED).days == ()


def test_the_query_is_a_value():
    query = recall_query(ASKED)
    assert query == recall_query(ASKED) and hash(query) == hash(recall_query(ASKED))
    with pytest.raises(dataclasses.FrozenInstanceError):
        query.terms = ("boat",)  # type: ignore[misc]


def test_a_query_without_terms_is_false_and_finds_nothing():
    store = Store()
    store.append_turn("c", "user", "The kayak is red.")
    bare = RecallQuery(speakers=("user",), days=((date(2023, 5, 1), date(2023, 6, 1)),))
    assert not RecallQuery() and not bare and RecallQuery(("kayak",))
    assert not recall_query("Who was it? Why?")  # question words only
    with store.connect() as con:
        assert search_before(con, "c", 1, bare) == []
        assert [t.seq for t in search_before(con, "c", 1, RecallQuery(("kayak",)))] == [1]


def test_a_list_of_stems_is_a_query_of_those_stems():
    store = Store()
    for text in ["The kayak is red.", "Lunch was soup.", "A red sail."]:
        store.append_turn("c", "user", text)
    with store.connect() as con:
        as_list = search_before(con, "c", 3, ["kayak", "red", ""])
        as_query = search_before(con, "c", 3, RecallQuery(("kayak", "red")))
    assert [t.id for t in as_list] == [t.id for t in as_query] and as_list[0].seq == 1


def test_a_message_naming_many_days_searches_by_the_first_few():
    text = "On 1 May 2023, 2 June 2023, 3 July 2023, 4 August 2023 or 5 September 2023?"
    days = recall_query(text).days
    assert len(days) == MAX_DAY_RANGES and days[0][0] < date(2023, 5, 1) < days[0][1]


def companion(store: Store, recall: bool = True) -> Companion:
    settings = ChatSettings(recall=recall, extract_facts=False)
    return Companion(FakeEngine(), store, "today", 2048, 200, settings)


def test_the_companion_reads_the_query_and_the_store_searches_by_it():
    store = Store()
    at = datetime(2023, 5, 2, 12, tzinfo=timezone.utc)
    store.append_turn("boats", "user", "My kayak is red.", at=at)
    store.append_turn("boats", "assistant", "My kayak is blue.", at=at)
    chat = companion(store)
    query = chat.prompt.recall_query("(You are Mel; I am Jo.) What colour is Mel's kayak?")
    assert query == RecallQuery(("colour", "kayak"), ("assistant",))
    assert not chat.prompt.recall_query("A plain remark, nothing asked.")  # no cue of the past
    assert not companion(store, recall=False).prompt.recall_query("Mel's kayak?")
    user, assistant = store.turns("boats")
    # The speaker named goes through the store's snapshot to the search: that speaker's turn
    # comes first, though the later turn would win the tie.
    mel = chat.context("(You are Mel; I am Jo.) What colour is Mel's kayak?")
    jo = chat.context("(You are Mel; I am Jo.) What colour is Jo's kayak?")
    plain = chat.context("What colour is the kayak?")
    assert mel.recalled[0] == assistant.id and plain.recalled[0] == assistant.id
    assert jo.recalled[0] == user.id
