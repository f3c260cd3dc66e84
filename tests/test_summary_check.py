"""The check of a model's rolling summary and the extractive summary that replaces a failed one
(mlxmem.memory.context.summary_check, .extractive, .speakers), with plain strings and the fake
engine's tokenizer; then a fold through the Companion records which of the two it stored."""

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.context.budget import PromptBudget
from mlxmem.memory.context.extractive import (
    extractive_summary,
    specific_clauses,
    specifics_left_out,
)
from mlxmem.memory.context.speakers import speaker_names
from mlxmem.memory.context.summary_check import check_summary
from mlxmem.memory.context.summary_words import key_items
from mlxmem.memory.store import Store
from mlxmem.memory.tables.turns import Turn
from mlxmem.memory.window import SUMMARY_REQUEST, ConversationWindow, summary_request
from mlxmem.testing import FakeEngine

DAY = datetime(2023, 5, 8, 12, tzinfo=timezone.utc)
CHAT = [
    ("user", "Hey Tom! Nice to catch you! How are things?"),
    ("assistant", "Hey Nadia! I'm busy with the kids & work. And you?"),
    ("user", "I joined a pottery class at the YMCA yesterday and it was so calming."),
    (
        "assistant",
        "Wow, that's cool, Nadia! I ran a fun run for the food bank on Saturday.",
    ),
    ("user", "That's great, Tom! I'm moving to Boston on 12 June, 3 weeks from now."),
    ("assistant", "Thanks, Nadia! We're going camping in Yosemite with the 2 kids next month."),
]
FOLDED = [text for _, text in CHAT]
# SmolLM2-135M's summaries of LoCoMo windows (benchmarks/results/summary-prompts-smollm2-135m)
REPEATS = (
    "I'm excited to explore new dance styles and techniques with you. I'm looking forward to "
    "sharing my passion for dance with others.\n\nI'm also excited to share my passion for dance "
    "with others. I'm excited to share my passion for dance with others.\n\nI'm excited to share "
    "my passion for dance with others. I'm excited to share my passion for dance with others."
)
RETOLD = "Hey Dana, I'm so glad you're here. I'm sure you're not alone in this."
ANSWERED = (
    "I'm glad you're excited about the upcoming dance studio! I'm sure it'll be a fantastic "
    "experience. I'm sure it'll be a fantastic experience!"
)
DECENT = (
    "Nadia joined a pottery class at the YMCA and is moving to Boston on 12 June. Tom ran a "
    "charity race on Saturday and plans a camping trip to Yosemite with her 2 kids next month."
)


def logged(chat=CHAT, day=DAY, per_day=2) -> list[Turn]:
    return [
        Turn(i + 1, "c", i + 1, role, text, day + timedelta(days=i // per_day), None, False)
        for i, (role, text) in enumerate(chat)
    ]


# -- the check --------------------------------------------------------------------------------


def test_a_decent_third_person_summary_passes():
    check = check_summary(DECENT, FOLDED)
    assert check.ok, check.problems
    assert check.coverage >= 0.5 and check.personal == 0


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (REPEATS, "repetition"),
        (ANSWERED, "repetition"),
        (RETOLD, "first-person"),
        (REPEATS, "first-person"),
        ("I'm sorry, but I can't summarize this conversation.", "refusal"),
        ("As an AI language model, I do not keep notes.", "refusal"),
        ("They talked about their week and some plans.", "coverage"),
        ("", "empty"),
        ("   ", "empty"),
    ],
)
def test_what_a_small_model_writes_fails(text, problem):
    check = check_summary(text, FOLDED)
    assert problem in check.problems
    assert not check.ok


def test_coverage_counts_the_earlier_summary_too():
    earlier = "Nadia adopted a dog called Oscar in Denver in 2019."
    thin = "Nadia is moving to Boston on 12 June; Tom ran a fun run on Saturday."
    assert check_summary(thin, FOLDED).ok
    merged = check_summary(thin, FOLDED, earlier)
    assert merged.coverage < check_summary(thin, FOLDED).coverage
    both = check_summary(thin + " Earlier: Oscar the dog, Denver, 2019.", FOLDED, earlier)
    assert both.coverage > merged.coverage


def test_quoted_words_are_no_first_person_retelling():
    quoted = 'Nadia told Tom about Boston: "I move on 12 June, and my sister helps me."'
    assert "first-person" not in check_summary(quoted, FOLDED).problems
    assert "first-person" in check_summary(quoted.replace('"', ""), FOLDED).problems


def test_key_items_are_names_numbers_and_dates():
    items = key_items(["Then Nadia moved to Boston on 12 June 2023.", "We met Anna in May."])
    assert items == {"nadia", "boston", "12", "june", "2023", "anna", "may"}
    assert key_items(["Hello there. I think so, OK?"]) == set()


# -- who is speaking --------------------------------------------------------------------------


def test_speaker_names_from_greetings_and_address():
    assert speaker_names(CHAT) == {"user": "Nadia", "assistant": "Tom"}
    # One mention is no evidence; a fact naming the user is.
    assert speaker_names(CHAT[:2]) == {}
    assert speaker_names(CHAT[:2], ["The user is called Nadia."]) == {"user": "Nadia"}
    assert speaker_names([("user", "Hi! My name is Ana and I bake bread.")]) == {"user": "Ana"}
    # A fact that says how the user is names no one (made "grateful" the user in conv-26's
    # summaries); nor does a greeting's next word in lower case ("Thanks, looking forward").
    facts = ["The user is grateful for her friends.", "The user is Melanie's friend."]
    assert speaker_names(CHAT[:2], facts) == {}
    assert speaker_names([("user", "Well, my name is not important.")] * 2) == {}
    said = [("assistant", "Thanks, looking forward to it!"), ("assistant", "Wow, ready to go?")]
    assert speaker_names(said * 2) == {}


def test_the_request_names_the_speakers_and_asks_for_the_third_person():
    named = summary_request({"user": "Nadia", "assistant": "Tom"})
    assert "Nadia (the user) and Tom (the assistant)" in named
    assert "third person" in named and "third person" in SUMMARY_REQUEST
    assert "the user and the assistant" in SUMMARY_REQUEST


# -- the extractive summary -------------------------------------------------------------------


def test_extractive_summary_fits_the_cap_and_keeps_who_said_what_when():
    engine = FakeEngine()
    turns = logged()
    text = extractive_summary(engine, 160, None, turns, speaker_names(CHAT))
    assert engine.count_text(text) <= 160
    assert "Boston" in text and "12 June" in text and "Yosemite" in text and "Saturday" in text
    assert "[9 May 2023] Nadia: I joined" in text  # the day of what it folds, and who said it
    assert "[10 May] Nadia: I'm moving" in text  # the year once, on the first line of it
    assert "Nadia: " in text and "Tom: " in text
    assert text.index("Nadia: I'm moving to Boston") < text.index("Tom: We're going camping")
    assert "Hey Tom" not in text and "Thanks, Nadia" not in text  # greetings carry nothing


@pytest.mark.parametrize("cap", [32, 60, 160])
def test_extractive_summary_is_deterministic_and_within_any_cap(cap):
    engine = FakeEngine()
    first = extractive_summary(engine, cap, "An earlier note.", logged(), {})
    again = extractive_summary(FakeEngine(), cap, "An earlier note.", logged(), {})
    assert first == again
    assert 0 < engine.count_text(first) <= cap


def test_without_names_it_says_user_and_assistant():
    text = extractive_summary(FakeEngine(), 160, None, logged(), {})
    assert "User: " in text and "Assistant: " in text


def test_extractive_summary_merges_an_earlier_one_with_its_days_and_speakers():
    engine, names = FakeEngine(), speaker_names(CHAT)
    earlier = extractive_summary(engine, 80, None, logged()[:4], names)
    later = logged(
        [
            ("user", "My cousin Priya visits on 3 July, Tom."),
            ("assistant", "Lovely! Priya can join our 4th of July barbecue."),
        ],
        DAY + timedelta(9),
    )
    merged = extractive_summary(engine, 160, earlier, later, names, earlier_is_extractive=True)
    assert engine.count_text(merged) <= 160
    assert "Priya" in merged and "[17 May]" in merged
    assert "[9 May 2023] Nadia: I joined" in merged  # the earlier summary's day and speaker, kept
    assert merged.index("[9 May 2023]") < merged.index("[17 May]")
    # Read back and written again, an extractive summary is unchanged.
    assert extractive_summary(engine, 160, merged, [], names, earlier_is_extractive=True) == merged


def test_each_year_is_written_once_and_read_back_for_every_line():
    engine = FakeEngine()
    new_year = datetime(2023, 12, 30, 12, tzinfo=timezone.utc)
    chat = [
        ("user", "I flew to Lisbon with Ana on 30 December."),
        ("assistant", "Lisbon in winter sounds lovely."),
        ("user", "We watched fireworks over Porto at midnight."),
        ("assistant", "Porto has the best fireworks."),
        ("user", "Back in Berlin on 2 January."),
        ("assistant", "Rest well in Berlin."),
    ]
    text = extractive_summary(engine, 200, None, logged(chat, new_year), {})
    lines = text.splitlines()
    assert lines[0].startswith("[30 December 2023] ") and lines[1].startswith("[31 December] ")
    assert lines[2].startswith("[1 January 2024] ")
    # Read back, each line has its year again: with the first day dropped (it adds nothing),
    # the line that now comes first says its year.
    assert extractive_summary(engine, 200, text, [], {}, earlier_is_extractive=True) == text
    earlier = "\n".join(["[29 December 2023] User: It was cold.", *lines])
    again = extractive_summary(engine, 200, earlier, [], {}, earlier_is_extractive=True)
    assert again == text
    without = "\n".join(["[29 December 2023] User: It was cold.", *lines[1:]])
    shorter = extractive_summary(engine, 200, without, [], {}, earlier_is_extractive=True)
    assert shorter.startswith("[31 December 2023] ") and "[1 January 2024] " in shorter


@pytest.mark.parametrize(
    ("sentence", "kept"),
    [
        ("I love it, and I started around 3 years ago.", "I started around 3 years ago."),
        (
            "It was so good, but my favourite was Dune by Frank Herbert!",
            "My favourite was Dune by Frank Herbert!",
        ),
        ("Last week I got a deal, and it was amazing.", None),  # nothing specific: all stays
        ("We hiked in Oregon, then we camped in Idaho for 2 nights!", None),  # all specific
        ("It was great, so much fun, in May!", None),  # what is left is under 3 words
        ("I went with my mom and dad to Paris last week.", None),  # one clause: not cut
        ("I bought a used car, which cost 3000 dollars.", None),  # "which" stays attached
        ('I said "wait, Paris is far" and it was fun.', None),  # a quote is not cut
        ("It was long, but did you see Dune?!", "Did you see Dune?!"),
        ("It took ages, but iPhone 12 arrived.", "iPhone 12 arrived."),
        ("It may rain a lot, but we won in Boston.", "We won in Boston."),  # "may": no month
        ("Tim came over, and we chatted all night.", "Tim came over."),  # a name opens it
        ("", None),
    ],
)
def test_an_older_sentence_keeps_its_clauses_with_names_numbers_and_dates(sentence, kept):
    assert specific_clauses(sentence) == (kept if kept is not None else sentence)


def test_a_sentence_of_the_earlier_summary_keeps_only_what_is_specific():
    earlier = (
        "[8 May 2023] Nadia: I went hiking with my friends, and we got lost near Denver "
        "for 2 hours."
    )
    later = logged([("user", "Tom, I adopted a cat named Oscar.")], DAY + timedelta(3))
    merged = extractive_summary(FakeEngine(), 160, earlier, later, {}, earlier_is_extractive=True)
    assert "[8 May 2023] Nadia: We got lost near Denver for 2 hours." in merged
    assert "with my friends" not in merged and "Oscar" in merged


def test_a_cut_sentence_read_back_again_stays_as_it_is():
    # The clause kept first now opens the sentence; its name must still count as one, or the
    # next fold would cut "Tim came over" too.
    engine = FakeEngine()
    earlier = "[8 May 2023] Nadia: I was tired, and Tim came over, and we cooked dinner at 7."
    once = extractive_summary(engine, 160, earlier, [], {}, earlier_is_extractive=True)
    assert once == "[8 May 2023] Nadia: Tim came over, and we cooked dinner at 7."
    assert extractive_summary(engine, 160, once, [], {}, earlier_is_extractive=True) == once


def test_a_model_summary_read_back_keeps_its_sentences_whole():
    model = "Nadia felt really proud of her work, and she ran 5 miles."
    assert extractive_summary(FakeEngine(), 160, model, [], {}) == model


def test_bracketed_text_that_is_no_day_and_days_without_a_year_read_back_as_written():
    earlier = (
        "[3 Things] Nadia: I pack 3 bags for Boston.\n"
        "[12 May] Tom: Ana visits Rome.\n"
        "[14 May] Nadia: Ana flies to Oslo."
    )
    again = extractive_summary(FakeEngine(), 160, earlier, [], {}, earlier_is_extractive=True)
    assert again == earlier


def test_nothing_said_still_gives_a_summary():
    assert extractive_summary(FakeEngine(), 40, None, [], {}) == "(nothing was said)"


# -- what a fold stores -------------------------------------------------------------------


def fold_with(summary: str) -> Store:
    def responder(prompt: str) -> str:
        return summary if "updated summary" in prompt else "Sounds good, tell me more."

    store = Store()
    companion = Companion(
        FakeEngine(responder), store, "default", 600, 120, ChatSettings(summary="model")
    )
    for i in range(16):
        companion.send(f"Nadia here: on day {i} I walked Rex {i} km along the Thames.")
    assert store.summaries("default"), "no fold happened"
    return store


def test_a_repeating_model_summary_is_replaced_by_an_extractive_one():
    store = fold_with(ANSWERED)
    for summary in store.summaries("default"):
        assert summary.source == "extractive"
        assert "fantastic experience" not in summary.text
        assert "Rex" in summary.text and "km" in summary.text
        assert summary.fact_ids == () and summary.first_seq == 1


def test_a_fold_names_its_speakers_from_the_whole_window():
    # The folded half never greets anyone; the half that stays does ("Thanks, Tom!"). The
    # extractive summary labels who said what by name, not "User" and "Assistant".
    chat = [
        ("user", "I moved to Boston on 12 June."),
        ("assistant", "We camp in Yosemite with the 2 kids in July."),
        ("user", "My sister Ana flies in on 3 July."),
        ("assistant", "Ana can join the 4th of July barbecue."),
        ("user", "Thanks, Tom! See you soon."),
        ("assistant", "Hey Nadia! Safe travels."),
        ("user", "Thanks, Tom! Bye for now."),
        ("assistant", "Hey Nadia! Bye."),
    ]
    engine = FakeEngine(lambda prompt: ANSWERED)  # fails the check: the summary is extracted
    window = ConversationWindow(
        engine, Store(), "c", PromptBudget(engine, 2000, 200), "Be kind.", "chat"
    )
    event = window.fold_oldest([], None, logged(chat))
    assert event.evicted_turns == 4 and event.summary.source == "extractive"
    assert "repetition" in event.fallback  # why the model's was not kept
    assert "Nadia: I moved to Boston" in event.summary.text
    assert "Tom: We camp in Yosemite" in event.summary.text
    assert "User:" not in event.summary.text and "Assistant:" not in event.summary.text


def test_a_decent_model_summary_is_kept_as_the_model_wrote_it():
    decent = "The user walked Rex along the Thames on days 0 to 9, 0 to 9 km a day."
    store = fold_with(decent)  # a 60-token cap: no room for a day's line after it
    assert [(s.source, s.text) for s in store.summaries("default")][0] == ("model", decent)


def test_a_model_summary_is_followed_by_the_specifics_it_left_out():
    # The model kept the gist and dropped names, numbers and dates: the folded turns'
    # sentences that hold them follow, under their day and speaker, within the cap.
    chat = [
        ("user", "I moved to Boston on 12 June, Tom."),
        ("assistant", "We camp in Yosemite with the 2 kids in July, Nadia."),
        ("user", "My sister Ana flies in on 3 July."),
        ("assistant", "Ana can join the barbecue at Lake Tahoe."),
        *CHAT,
    ]
    gist = "Nadia moved to Boston on 12 June; Tom goes camping with his kids."
    engine = FakeEngine(lambda prompt: gist)
    window = ConversationWindow(
        engine, Store(), "c", PromptBudget(engine, 2000, 200), "Be kind.", "chat"
    )
    event = window.fold_oldest([], None, logged(chat))
    folded = [text for _, text in chat[: event.evicted_turns]]
    assert check_summary(gist, folded).ok and event.summary.source == "model+extractive"
    assert event.fallback is None
    text = event.summary.text
    assert text.startswith(gist + "\n[")
    assert "Tom: We camp in Yosemite" in text and "Ana flies in on 3 July" in text
    assert "Lake Tahoe" in text and engine.count_text(text) <= window.summary_cap
    assert "Boston" not in text.removeprefix(gist)  # what the model said is not said again
    # Nothing left out, or no room: the model's summary alone.
    every = gist + " Tom camps in Yosemite in July with 2 kids; Ana flies in on 3 July and "
    every += "joins the barbecue at Lake Tahoe."
    assert specifics_left_out(engine, 200, every, logged(chat)[:4], {}) == ""
    assert specifics_left_out(engine, 3, gist, logged(chat)[:4], {}) == ""
    # The next fold's model summary drops them again: the earlier summary's lines compete.
    later = logged([("user", "I start at the Boston Globe on 1 August.")], DAY + timedelta(9))
    again = specifics_left_out(engine, 200, gist, later, {"user": "Nadia"}, text)
    assert "Nadia: I start at the Boston Globe on 1 August." in again
    assert "Lake Tahoe" in again and "Yosemite" in again  # from the earlier summary's lines
    # A tight room still keeps one sentence of the newest fold.
    tight = specifics_left_out(engine, 40, gist, later, {"user": "Nadia"}, text)
    assert "Boston Globe" in tight
    # "may", "next week": no name, number or date, so nothing to add.
    vague = logged([("user", "I may be late, sorry."), ("assistant", "Talk next week then.")])
    assert specifics_left_out(engine, 200, "They made plans.", vague, {}) == ""


def test_after_a_model_summary_with_specifics_the_next_fold_reads_them_back():
    gist = "Nadia and Tom talk about summer plans."
    lines = "[8 May 2023] Tom: We camp in Yosemite with the 2 kids in July.\n"
    lines += "[9 May] Nadia: My sister Ana flies in on 3 July. Tom: Ana can join us at Lake Tahoe."
    earlier = f"{gist}\n{lines}"
    # The model's next summary may carry the lines forward: they quote the turns, in the first
    # person, and the check does not count that against it, nor their items as its to keep.
    carried = "Nadia and Tom keep planning the summer; Ana visits.\n" + lines
    later = [Turn(9, "c", 9, "user", "We rented a cabin.", DAY + timedelta(20), None, False)]
    assert check_summary(carried, [t.text for t in later], gist).ok
    # A fallback after it reads the lines back with their days and speakers.
    merged = extractive_summary(FakeEngine(), 100, earlier, later, {"user": "Nadia"})
    assert "\n[8 May 2023] Tom: We camp in Yosemite with the 2 kids in July.\n" in merged
    assert "\n[9 May] Tom: Ana can join us at Lake Tahoe.\n" in merged  # its day, its speaker
    assert "[28 May] Nadia: We rented a cabin." in merged


def test_chat_context_says_who_wrote_the_summary(capsys):
    from mlxmem.cli.repl import Session

    store = fold_with(ANSWERED)
    latest = store.latest_summary("default")

    def open_chat(model, conversation):
        return Companion(FakeEngine(), store, conversation, 600, 120, ChatSettings())

    Session(open_chat, "fake", "default", term=None).print_context(None)
    shown = capsys.readouterr().err
    assert f"summary of turns #1-#{latest.last_seq}: extractive: picked from the turns" in shown


def test_a_fold_with_nothing_remarkable_still_keeps_one_of_its_sentences():
    # No name, number or date, few content words: before, the summary was only the earlier
    # one, and the folded turns left no trace.
    plain = [
        Turn(1, "c", 1, "user", "My boss yelled at me again. I want to quit.", DAY, None, False)
    ]
    text = extractive_summary(FakeEngine(), 160, "The user had a rough day.", plain, {})
    assert "yelled at me again" in text or "I want to quit" in text


def test_a_summary_in_another_script_is_read_as_words():
    russian = "Пользователь переехал в Москву в мае и работает врачом в больнице."
    check = check_summary(russian, ["Я переехал в Москву в мае.", "Я работаю врачом."])
    assert "empty" not in check.problems and check.ok


def test_the_extractive_summary_does_not_depend_on_the_hash_seed():
    code = (
        "from mlxmem.memory.context.speakers import without_address as w;"
        "print(w('Thanks for the tip, Tom, Nadia!', {'Tom', 'Nadia', 'Ana', 'Bo'}))"
    )
    seen = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in range(8)
    }
    assert len(seen) == 1


def test_a_name_from_a_fact_passes_the_same_check_as_one_from_a_greeting():
    # "The user is Yeah ..." is no name, however a small model capitalizes it.
    assert speaker_names(CHAT[:2], ["The user is Yeah happy today."]) == {}
    assert speaker_names([("user", "my name is So and so.")] * 2) == {}
