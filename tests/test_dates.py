"""Time in the memory (issue 19, item 3): every turn has its time, the window shows the date
where the day changes, recalled turns and the summary keep their dates. Fake engine, real
DuckDB files. Times are at noon UTC, so that the day is the same in any local time zone."""

import os
import time
from datetime import date, datetime, timedelta, timezone

import pytest
from conftest import on

from mlxmem.engine import Message
from mlxmem.errors import InputError
from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.context.budget import SUMMARY_HEADER, system_text
from mlxmem.memory.recall import RecallQuery, recall_line, recall_query, search_before
from mlxmem.memory.store import Store
from mlxmem.memory.tables.dates import (
    anchored,
    day_range,
    local_midnight_utc,
    named_days,
    unanchored,
)
from mlxmem.memory.window import UNANSWERED, as_messages
from mlxmem.testing import FakeEngine


def day(n: int, hour: int = 12) -> datetime:
    """Noon (or `hour` UTC) of May `n`, 2023."""
    return datetime(2023, 5, n, hour, tzinfo=timezone.utc)


def summarizer(prompt: str) -> str:
    return "They talked about the garden." if "updated summary" in prompt else "I see."


def test_a_turn_keeps_the_time_it_is_given_and_never_goes_back_in_time():
    store = Store()
    first = store.append_turn("import", "user", "Planted tomatoes.", at=day(8))
    assert first.created_at == day(8)
    assert store.conversation("import").created_at == day(8)  # created at its first turn
    in_tokyo = day(9).astimezone(timezone(timedelta(hours=9)))
    assert store.append_turn("import", "assistant", "Nice!", at=in_tokyo).created_at == day(9)
    # Older than the newest turn: recorded just after it, as for a device's clock gone back.
    older = store.append_turn("import", "user", "A day too early.", at=day(1))
    assert older.created_at == day(9) + timedelta(microseconds=1)
    later = store.append_turn("import", "user", "And now.")  # no time: now, after them all
    assert later.created_at > day(9)
    assert [t.created_at for t in store.turns("import")] == [
        day(8),
        day(9),
        day(9) + timedelta(microseconds=1),
        later.created_at,
    ]
    with pytest.raises(InputError, match="time zone"):
        store.append_turn("import", "user", "naive", at=datetime(2023, 5, 8, 12))
    assert len(store.turns("import")) == 4  # the refused turn was not logged


def turns_on(days: list[int], name: str = "c") -> list:
    """Conversation `name` logged one turn per entry of `days`, users and replies alternating,
    with the ids the fake engine encodes them as."""
    store, engine = Store(), FakeEngine()
    for i, n in enumerate(days):
        role = "user" if i % 2 == 0 else "assistant"
        text = f"Message {i}."
        ids = engine.encode_text(text)
        store.append_turn(name, role, text, len(ids), False, ids, "fake", at=day(n, 9 + i))
    return store.turns(name)


def test_the_window_dates_a_message_only_where_the_day_changes():
    turns = turns_on([8, 8, 9, 9, 12, 12])
    messages = as_messages(turns, "fake")
    assert [m.content for m in messages] == [
        "Message 0.",
        "Message 1.",
        "[9 May 2023]\nMessage 2.",
        "Message 3.",
        "[12 May 2023]\nMessage 4.",
        "Message 5.",
    ]
    # An undated message keeps its stored ids; a dated one is encoded whole, marker included.
    assert [m.tokens is not None for m in messages] == [True, True, False, True, False, True]
    # The first turn of a window is dated against the turn before it in the log.
    assert as_messages(turns[2:], "fake")[0].content == "Message 2."
    assert as_messages(turns[2:], "fake", before=day(8))[0].content.startswith("[9 May 2023]\n")
    assert as_messages(turns[3:], "fake", before=turns[2].created_at)[0].content == "Message 3."
    # A conversation within one day reads exactly as before dates existed.
    same = turns_on([8, 8, 8, 8], "one day")
    assert as_messages(same, "fake", before=day(8, 1)) == [
        Message(t.role, t.text, t.sampled_ids) for t in same
    ]


def test_an_unanswered_turn_is_dated_against_the_turn_before_it_in_the_log():
    store = Store()
    store.append_turn("c", "user", "Monday.", at=day(8))
    store.append_turn("c", "user", "Tuesday.", at=day(9))
    messages = as_messages(store.turns("c"), "fake")
    assert [m.content for m in messages] == ["Monday.", UNANSWERED, "[9 May 2023]\nTuesday."]


def test_dates_survive_folding_and_each_turn_reads_the_same_as_the_window_slides():
    engine = FakeEngine(summarizer)
    store = Store()
    companion = Companion(engine, store, "c", 600, 120, ChatSettings(extract_facts=False))
    seen: dict[int, str] = {}  # seq -> how the turn read in every prompt that held it
    changed = []
    first_dated = 0  # windows whose first turn shows its date
    for i in range(20):
        at = day(8 + i)  # an exchange a day
        text = f"Message {i}: the garden grows, slowly, in the sun."
        prompt = companion.import_exchange(text, f"Reply {i}.", (at, at)).prompt
        assert len(prompt.tokens) == len(engine.encode_chat(prompt.messages))  # exact budget
        assert len(prompt.tokens) + prompt.layers.reserve <= prompt.budget
        snap = store.snapshot("c")
        before = snap.summary_span and snap.summary_span[1]
        for t, m in zip(snap.turns, companion.window.messages(snap.turns, before), strict=True):
            if seen.setdefault(t.seq, m.content) != m.content:
                changed.append(t.seq)
        first_dated += snap.summary is not None and seen[snap.turns[0].seq].startswith("[")
    assert store.summaries("c"), "the window never folded: the test proves nothing"
    assert changed == []
    assert first_dated > 0  # a dated turn kept its date at the start of the window
    # The summary's header names the days it covers, from its first turn to its last.
    snap = store.snapshot("c")
    assert snap.summary_span == (day(8), store.turns("c")[snap.summary.last_seq - 1].created_at)
    system = companion.context().messages[0].content
    assert f"Summary of the earlier conversation ({day_range(*snap.summary_span)}):" in system
    assert day_range(*snap.summary_span).startswith("8 May 2023 to ")


def test_the_newest_message_on_a_new_day_shows_today():
    engine = FakeEngine()
    companion = Companion(engine, Store(), "c", 600, 120, ChatSettings(extract_facts=False))
    companion.import_exchange("Good morning.", "Morning!", (day(8), day(8)))
    assert companion.context("Later that day.", at=day(8, 20)).messages[-1].content == (
        "Later that day."
    )
    assert companion.context("Next day?", at=day(9)).messages[-1].content == (
        "[9 May 2023]\nNext day?"
    )
    assert companion.context("Same day?", at=day(8, 21)).messages[-1].content == "Same day?"
    newest = companion.import_exchange("A week on.", "Oh!", (day(15), day(15))).prompt.messages[-1]
    assert newest.content == "[15 May 2023]\nA week on."


def test_recalled_turns_and_the_summary_header_carry_their_dates():
    turn = turns_on([8])[0]
    assert recall_line(turn) == "- [8 May 2023] user: Message 0."
    assert system_text("Be kind.", [], "They met.") == f"Be kind.\n\n{SUMMARY_HEADER}\nThey met."
    assert system_text("Be kind.", [], "They met.", (day(8), day(8, 20))) == (
        "Be kind.\n\nSummary of the earlier conversation (8 May 2023):\nThey met."
    )
    assert day_range(day(8), day(25)) == "8 May 2023 to 25 May 2023"


@pytest.mark.parametrize(
    "text, shown",
    [
        ("We went last week.", "We went last week (the week before 16 May 2023)."),
        (
            "Yesterday, and the day before yesterday",
            "Yesterday (15 May 2023), and the day before yesterday (14 May 2023)",
        ),
        (
            "We adopted her two weeks ago!",
            "We adopted her two weeks ago (two weeks before 16 May 2023)!",
        ),
        ("an hour ago, a day ago", "an hour ago, a day ago (a day before 16 May 2023)"),
        (
            "last month; the past year",
            "last month (April 2023); the past year (the year before 16 May 2023)",
        ),
        ("last year", "last year (2022)"),
        ("last Friday", "last Friday (12 May 2023)"),  # 16 May 2023 was a Tuesday
        ("last weekend", "last weekend (the weekend before 16 May 2023)"),
        (
            "0 days ago, a week-long trip, the last Friday of May",
            "0 days ago, a week-long trip, the last Friday of May",
        ),
        ("On 3 May 2023 we met.", "On 3 May 2023 we met."),  # said outright already
    ],
)
def test_a_recalled_turn_says_outright_the_days_it_names_from_when_it_was_written(text, shown):
    assert anchored(text, day(16, 12)) == shown
    assert unanchored(shown) == text  # a turn's own words can still be found in a prompt


def test_a_recalled_turn_read_out_of_its_place_carries_the_day_it_meant():
    text = "I joined a support group last week."
    Store().append_turn("c", "user", text, 9, False, None, "fake", at=day(16, 12))
    (turn,) = Store().turns("c")
    assert recall_line(turn) == (
        "- [16 May 2023] user: I joined a support group last week (the week before 16 May 2023)."
    )


def test_a_given_time_travels_with_its_turn_to_another_device(devices):
    a, b, folder = devices
    os.environ["MLXMEM_HOME"] = str(a)
    Store().append_turn("default", "user", "Imported from 2023.", at=day(8))
    Store().append_turn("default", "assistant", "An old reply.", at=day(9))
    os.environ["MLXMEM_HOME"] = str(b)
    Store().append_turn("default", "user", "Written on B today.")
    on(a, "sync", str(folder))
    on(b, "sync", str(folder))
    on(a, "sync")
    for home in (a, b):
        os.environ["MLXMEM_HOME"] = str(home)
        turns = Store().turns("default")
        assert [(t.text, t.created_at) for t in turns[:2]] == [
            ("Imported from 2023.", day(8)),
            ("An old reply.", day(9)),
        ]  # ordered by time across devices: the imported turns come first
        assert turns[2].text == "Written on B today." and turns[2].created_at > day(9)
        assert [t.seq for t in turns] == sorted(t.seq for t in turns)


# -- days a message names, in recall -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ranges"),
    [
        ("What did Gina find on 1 February, 2023?", [("2023-01-25", "2023-02-09")]),
        ("And on May 23, 2023? Or the 3rd of June 2023?", [("2023-05-16", "2023-05-31"),
                                                          ("2023-05-27", "2023-06-11")]),
        ("What happened in december 2023?", [("2023-12-01", "2024-01-01")]),
        ("In July, 2022 and June 2022.", [("2022-07-01", "2022-08-01"),
                                          ("2022-06-01", "2022-07-01")]),
        ("When did we go camping in June?", []),  # a month alone narrows nothing
        ("Back in 2022, maybe?", []),
        ("On 31 February 2023, or 1 January 0001?", []),  # no such day; out of range
        ("In January 0001?", []),  # its midnight is before the earliest time a store holds
        ("On 3  June\n2023, and again on June 3rd, 2023?", [("2023-05-27", "2023-06-11")]),
    ],
)  # fmt: skip
def test_the_days_a_message_names(text, ranges):
    assert [(a.isoformat(), b.isoformat()) for a, b in named_days(text)] == ranges


def test_recall_prefers_the_turns_of_the_days_a_message_names(tmp_path):
    store = Store(tmp_path / "days.duckdb")
    june_1 = datetime(2023, 6, 1, 12, tzinfo=timezone.utc)
    for at, text in [(day(2), "We baked rye bread."), (day(20), "We baked rye bread again."),
                     (june_1, "We baked rye bread with seeds.")]:  # fmt: skip
        store.append_turn("c", "user", text, at=at)
    asked = recall_query("What bread did we bake on 2 May 2023?")
    assert asked.terms == ("bread", "bake", "may", "2023")
    assert asked.days == ((date(2023, 4, 25), date(2023, 5, 10)),)

    def found(query):
        with store.connect() as con:
            return [t.seq for t in search_before(con, "c", 3, query)]

    assert found(recall_query("What bread did we bake?")) == [2, 3, 1]
    assert found(asked) == [1, 2, 3]
    # A month: its turns from its first day to its last, in the device's time zone.
    assert found(recall_query("What bread did we bake in May 2023?")) == [2, 1, 3]


# Seen from Wednesday 17 May 2023.
@pytest.mark.parametrize(
    ("text", "ranges"),
    [
        ("What did I tell you yesterday?", [("2023-05-16", "2023-05-17")]),
        ("And the day before yesterday?", [("2023-05-15", "2023-05-16")]),
        ("Three days ago, or 3 days ago?", [("2023-05-13", "2023-05-16")]),
        ("A couple of  days ago?", [("2023-05-14", "2023-05-17")]),
        ("Two weeks ago, you said?", [("2023-04-26", "2023-05-11")]),
        ("What did I say last week?", [("2023-05-03", "2023-05-17")]),
        ("Last weekend?", [("2023-05-13", "2023-05-15")]),
        ("Last Wednesday, or last friday?", [("2023-05-10", "2023-05-11"),
                                             ("2023-05-12", "2023-05-13")]),
        ("Last month?", [("2023-04-01", "2023-05-01")]),
        ("A month ago?", [("2023-04-02", "2023-05-03")]),
        ("Last year, then two years ago?", [("2022-01-01", "2023-01-01"),
                                            ("2021-01-01", "2022-01-01")]),
        ("Yesterday, on 3 June 2023?", [("2023-05-16", "2023-05-17"),
                                        ("2023-05-27", "2023-06-11")]),
        ("2023 years ago?", []),  # before the year 1: skipped
        ("The last weekday, the past weeks, 0 days ago.", []),
        ("In the past year, or the last month?", [("2022-05-16", "2023-05-18"),
                                                  ("2023-04-16", "2023-05-18")]),  # until today
        ("The day before\n  yesterday, and last week's game?", [("2023-05-15", "2023-05-16"),
                                                                ("2023-05-03", "2023-05-17")]),
        ("At last week-long trips, on the last Friday of May.", []),
        ("Fıve days ago, in Auguſt 2023?", []),  # no crash on letters that fold to ASCII
    ],
)  # fmt: skip
def test_the_days_a_message_names_from_the_day_it_is_written(text, ranges):
    today = date(2023, 5, 17)
    assert [(a.isoformat(), b.isoformat()) for a, b in named_days(text, today)] == ranges
    if not any("2023-06" in b for _, b in ranges):  # without its day, no relative day is read
        assert named_days(text) == []


@pytest.mark.parametrize(
    ("today", "weekend"),
    [(20, 13), (21, 13), (22, 20)],  # Saturday, Sunday, Monday 20-22 May
)
def test_last_weekend_is_the_latest_one_over_before_today(today, weekend):
    assert named_days("last weekend", date(2023, 5, today)) == [
        (date(2023, 5, weekend), date(2023, 5, weekend + 2))
    ]


def test_recall_reads_the_days_a_message_names_from_when_it_is_written(tmp_path):
    store = Store(tmp_path / "relative.duckdb")
    for at, text in [(day(2), "We baked rye bread."), (day(15), "We baked rye bread again."),
                     (day(16), "We baked rye bread with seeds.")]:  # fmt: skip
        store.append_turn("c", "user", text, at=at)
    companion = Companion(FakeEngine(), store, "c", 600, 120, ChatSettings(extract_facts=False))
    asked = companion.prompt.recall_query("What bread did we bake two weeks ago?", at=day(16))
    assert asked == RecallQuery(
        ("bread", "bake", "two", "week"), days=((date(2023, 4, 25), date(2023, 5, 10)),)
    )
    plain = companion.prompt.recall_query("What bread did we bake?", at=day(16))
    with store.connect() as con:
        assert [t.seq for t in search_before(con, "c", 3, plain)] == [2, 3, 1]
        assert [t.seq for t in search_before(con, "c", 3, asked)] == [1, 2, 3]


@pytest.fixture
def time_zone(monkeypatch):
    """Sets the process's local time zone (POSIX TZ, with the system's tz database)."""
    if not hasattr(time, "tzset"):
        pytest.skip("no time.tzset here")

    def set_zone(name: str) -> None:
        monkeypatch.setenv("TZ", name)
        time.tzset()
        if time.tzname[0] in ("UTC", "GMT") and name != "UTC":
            pytest.skip(f"no tz database entry for {name}")

    yield set_zone
    monkeypatch.delenv("TZ", raising=False)
    time.tzset()


def test_a_named_day_starts_at_its_first_local_instant(time_zone):
    time_zone("Asia/Tokyo")
    assert local_midnight_utc(date(2023, 5, 2)) == datetime(2023, 5, 1, 15)  # naive UTC
    # Santiago's clocks went from 23:59:59 to 01:00 on 3 September 2023: the day began at
    # 01:00 (UTC-3), not an hour before, on 2 September.
    time_zone("America/Santiago")
    assert local_midnight_utc(date(2023, 9, 3)) == datetime(2023, 9, 3, 4)
    # Havana's midnight of 5 November 2023 came twice: the day began at the first.
    time_zone("America/Havana")
    assert local_midnight_utc(date(2023, 11, 5)) == datetime(2023, 11, 5, 4)
