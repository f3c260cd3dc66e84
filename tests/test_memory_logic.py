"""The memory layers with the fake engine (same interface as the MLX one) and a real DuckDB
file: fold boundaries, the budget invariant, facts in the prompt, extraction filters."""

import re
from typing import NamedTuple

import pytest
from conftest import FACT, scripted, user_text
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxmem.engine import Message
from mlxmem.errors import InputError
from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.context.budget import RECALL_HEADER, PromptBudget
from mlxmem.memory.extraction import (
    EXAMPLE_WORDS,
    EXAMPLES,
    FactExtractor,
    extraction_messages,
    is_duplicate,
    judge,
    normalize,
    replacement_candidates,
    still_true,
    without_addressee,
)
from mlxmem.memory.store import Store
from mlxmem.memory.window import (
    MIN_VERBATIM,
    SUMMARY_REQUEST,
    UNANSWERED,
    ConversationWindow,
    as_messages,
    evict_count,
    summary_cap,
)
from mlxmem.testing import FakeEngine


def make(budget=600, reserve=120, responder=scripted, **settings):
    engine = FakeEngine(responder)
    store = Store()
    companion = Companion(engine, store, "default", budget, reserve, ChatSettings(**settings))
    return engine, store, companion


class Row:
    def __init__(self, role):
        self.role = role


def test_evict_count_folds_the_oldest_half_and_keeps_two_exchanges():
    turns = lambda n: [Row("user" if i % 2 == 0 else "assistant") for i in range(n)]  # noqa: E731
    assert evict_count(turns(MIN_VERBATIM)) == 0
    assert evict_count(turns(6)) == 2  # half would be 3; 2 keeps whole exchanges and 4 turns
    assert evict_count(turns(12)) == 6
    assert evict_count(turns(13)) == 6
    assert evict_count(turns(5)) == 1  # cannot end on an exchange without going under 4


def sent(recall: bool, i: int) -> str:
    """The i-th message of a long chat; with recall, every fourth one after the first folds
    asks about an early turn, so that recall finds it in the log."""
    if recall and i >= 12 and i % 4 == 0:
        return f"Turn {i}: how many sardines did Miso eat in turn {i - 10}?"
    return user_text(i)


class LongChat(NamedTuple):
    engine: FakeEngine
    store: Store
    turns: list  # per turn: its result and the model calls it made
    messages: list[str]  # what was sent, in order
    recall: bool
    budget: int


# Recall keeps 12.5% of the budget free for its block: at 600 tokens the window would fold on
# 37 of 40 turns (18 without recall), at 1,024 on 8 (7 without).
@pytest.fixture(scope="module", params=[(True, 1024), (False, 600)], ids=["recall", "no-recall"])
def long_chat(request, tmp_path_factory) -> LongChat:
    """40 turns through the fake engine, with recall (the default) and without, each on a
    small budget: the runs every invariant test below reads."""
    recall, budget = request.param
    engine = FakeEngine(scripted)
    store = Store(tmp_path_factory.mktemp("long") / "mlxmem.duckdb")
    settings = ChatSettings(recall=recall)
    companion = Companion(engine, store, "default", budget, 120, settings)
    messages = [sent(recall, i) for i in range(40)]
    turns = []
    for text in messages:
        before = len(engine.calls)
        result = companion.send(text)
        turns.append((result, engine.calls[before:]))
    return LongChat(engine, store, turns, messages, recall, budget)


def test_budget_every_model_call_fits(long_chat):
    for result, calls in long_chat.turns:
        for call in calls:
            assert call.prompt_tokens + call.max_tokens <= long_chat.budget
        assert sum(result.prompt.layers.to_dict().values()) == long_chat.budget


def test_the_newest_message_is_in_the_prompt_verbatim(long_chat):
    for (result, _), text in zip(long_chat.turns, long_chat.messages, strict=True):
        newest = result.prompt.messages[-1]
        assert newest.role == "user"
        if result.prompt.recalled:  # the recalled block, then the message as it was sent
            assert newest.content.startswith(RECALL_HEADER)
            assert newest.content.endswith("\n\n" + text)
        else:
            assert newest.content == text
    # The questions about early turns found them in the log; without recall, nothing is.
    recalled = sum(bool(r.prompt.recalled) for r, _ in long_chat.turns)
    assert recalled >= 5 if long_chat.recall else recalled == 0


def test_between_folds_only_the_new_message_is_prefilled(long_chat):
    engine, turns, messages = long_chat.engine, long_chat.turns, long_chat.messages
    quiet = [(i, r) for i, (r, _) in enumerate(turns) if i > 0 and not r.folds]
    assert len(quiet) >= 20
    for i, result in quiet:
        # The message, and its recalled block; after a turn that recalled, that message (its
        # block is gone from it now) and its reply are prefilled again.
        allowed = engine.count_text(messages[i]) + 10 + result.prompt.layers.recall
        previous = turns[i - 1][0]
        if previous.prompt.recalled:
            allowed += engine.count_text(messages[i - 1] + previous.reply) + 16
        assert result.stats.prefilled_tokens <= allowed


def test_nothing_lost_every_turn_is_logged_in_order(long_chat):
    log = long_chat.store.turns("default")
    assert [m.text for m in log if m.role == "user"] == long_chat.messages
    assert [m.role for m in log] == ["user", "assistant"] * 40


def test_compress_never_forget_every_turn_is_summarized_or_verbatim(long_chat):
    assert sum(bool(r.folds) for r, _ in long_chat.turns) >= 3
    snap = long_chat.store.snapshot("default")
    assert snap.summary is not None and snap.summary.first_seq == 1
    assert [m.seq for m in snap.turns] == list(range(snap.summary.last_seq + 1, 81))
    assert len(snap.turns) >= MIN_VERBATIM


def test_summaries_keep_their_token_cap(long_chat):
    summaries = long_chat.store.summaries("default")
    assert summaries
    for s in summaries:
        assert s.token_count <= summary_cap(long_chat.budget)


def test_fold_is_generated_on_the_cached_chat_prefix():
    engine, _, companion = make(summary="model")
    for i in range(40):
        result = companion.send(user_text(i))
        if result.folds:
            break
    else:
        pytest.fail("no fold happened")
    summary_calls = [c for c in engine.calls if SUMMARY_REQUEST in c.prompt]
    assert summary_calls
    event = result.folds[0]
    # Only the request (and its template markers) is prefilled, not the evicted turns.
    request_tokens = engine.count_text(SUMMARY_REQUEST)
    assert event.prefilled_tokens <= request_tokens + 10
    assert event.cached_tokens == event.prompt_tokens - event.prefilled_tokens


def test_by_default_a_fold_writes_the_extractive_summary_and_asks_the_model_nothing(
    tmp_path, monkeypatch
):
    # Nor is the request for the model's summary assembled (a tokenization of the folded turns
    # for nothing).
    def no_request(self):
        pytest.fail("the model's summary request was assembled for an extractive fold")

    with monkeypatch.context() as patched:
        patched.setattr(ConversationWindow, "_summary_budget", no_request)
        engine, store, companion = make()
        folds = [e for i in range(30) for e in companion.send(user_text(i)).folds]
    summaries = store.summaries("default")
    assert summaries and {s.source for s in summaries} == {"extractive"}
    assert folds and {(e.fallback, e.prompt_tokens) for e in folds} == {("extractive asked", 0)}
    assert not any(SUMMARY_REQUEST in c.prompt for c in engine.calls)
    # --summary model asks it, on the same turns (in a store of its own: the fake engine's
    # token ids are its own).
    engine = FakeEngine(scripted)
    store = Store(tmp_path / "model.duckdb")
    companion = Companion(engine, store, "default", 600, 120, ChatSettings(summary="model"))
    for i in range(30):
        companion.send(user_text(i))
    assert any(SUMMARY_REQUEST in c.prompt for c in engine.calls)
    assert "model" in {s.source.split("+")[0] for s in store.summaries("default")}


def test_summary_failure_still_folds_the_turns_in():
    def mute(prompt):
        return "" if "updated summary" in prompt else "ok then, that is good to hear."

    _, store, companion = make(responder=mute, summary="model")
    for i in range(30):
        companion.send(user_text(i))
    summary = store.latest_summary("default")
    assert summary is not None and "sardines" in summary.text  # the extractive fallback


def test_new_automatic_fact_waits_for_a_fold_manual_fact_shows_at_once():
    engine, store, companion = make(budget=2000)
    result = companion.send("I have a cat called Miso and she is the most important one to me.")
    assert result.fact_added is not None and result.fact_added.text == FACT
    companion.send("hello")
    assert FACT not in engine.calls[-1].prompt  # prefix kept stable: not yet in the facts block
    other = Store()  # another process
    other.add_fact("The user is called Ana.", source="manual")
    companion.send("hello again")
    assert "The user is called Ana." in engine.calls[-1].prompt
    # Another process going on with the conversation shows the same facts block: which
    # automatic facts a conversation shows is the store's state, not the process's.
    fresh = Companion(engine, store, "default", 2000, 120, ChatSettings())
    fresh.send("and now?")
    prompt = [c for c in engine.calls if c.slot == "default/chat"][-1].prompt
    assert FACT not in prompt and "Ana" in prompt
    # A conversation begun after the fact was noted shows it, manual facts first.
    Companion(engine, store, "other", 2000, 120, ChatSettings()).send("hi there")
    prompt = [c for c in engine.calls if c.slot == "other/chat"][-1].prompt
    assert FACT in prompt and prompt.index("Ana") < prompt.index(FACT)


def test_one_process_per_turn_reuses_the_whole_previous_prompt_until_a_fold():
    engine = FakeEngine(scripted)
    long = "I have a cat called Miso and she sleeps on the balcony every afternoon, all summer."
    previous, reused = None, 0
    for i in range(12):
        companion = Companion(engine, Store(), "default", 900, 120, ChatSettings())  # a process
        result = companion.send(f"{long} Day {i}.")
        if previous is not None:  # a fold after the last reply starts a new prefix
            assert result.stats.cached_tokens >= previous  # the last prompt, and more
            reused += 1
        previous = None if result.folds else result.stats.prompt_tokens
    assert reused >= 6
    folded = [c.prompt for c in engine.calls if c.slot == "default/chat"][-1]
    assert Store().latest_summary("default") is not None and FACT in folded  # joined at a fold


def test_fact_deleted_elsewhere_is_gone_before_the_next_reply():
    engine, store, companion = make(budget=2000)
    fact = Store().add_fact("The user's secret word is PLUM-42.", source="manual")
    companion.send("hi")
    assert "PLUM-42" in engine.calls[-1].prompt
    Store().delete_facts([fact.id])
    companion.send("hi again")
    assert "PLUM-42" not in engine.calls[-1].prompt


def test_extraction_failure_never_breaks_the_chat():
    def broken(prompt):
        if "durable facts" in prompt:
            raise RuntimeError("model fell over")
        return "fine."

    _, store, companion = make(responder=broken)
    with pytest.warns(UserWarning, match="fact extraction failed"):
        result = companion.send("My sister Ana lives in Porto and visits me every single summer.")
    assert result.reply == "fine." and result.fact_added is None
    assert store.facts() == []


def test_duplicate_facts_are_not_added_twice():
    _, store, companion = make(budget=2000)
    store.add_fact("the user has a cat called Miso", source="manual")
    result = companion.send("I have a cat called Miso and she is the most important one to me.")
    assert result.fact_added is None
    assert len(store.facts()) == 1


def test_a_fact_stored_while_the_turn_ran_is_not_stored_again_by_it():
    # The extractor saw the facts of the turn's snapshot; the same fact, written meanwhile
    # (another process, the page), is not added a second time when the turn ends.
    def responder(prompt):
        if "durable facts" in prompt:
            store.add_fact(FACT.upper(), source="manual")
            return FACT
        return "fine."

    _, store, companion = make(budget=2000, responder=responder)
    result = companion.send("I have a cat called Miso and she sleeps on the balcony all summer.")
    assert result.fact_added is None
    assert [f.text for f in store.facts()] == [FACT.upper()]


def test_extraction_outcomes_are_counted_by_the_filter_that_decided():
    answers = iter([FACT, FACT, "NONE", "<|eot_id|> system"])

    def responder(prompt):
        return next(answers) if "durable facts" in prompt else "fine."

    _, store, companion = make(budget=2000, responder=responder)
    long = "I have a cat called Miso and she sleeps on the balcony every afternoon, all summer."
    looks = []
    for text in ["short one", long, long + " Again.", long + " Once more.", long + " Last."]:
        looks += companion.send(text).looks
    # The short message is never sent to the extractor; each other one has one outcome.
    assert looks == ["kept", "duplicate", "none", "markup"]
    assert [f.text for f in store.facts()] == [FACT]


def test_empty_and_invalid_messages_are_refused_and_nothing_is_logged():
    _, store, companion = make()
    for bad in ["", "   \n", "broken \udcff text"]:
        with pytest.raises(InputError):
            companion.send(bad)
    assert store.turns("default") == []


def test_huge_message_is_shortened_in_the_prompt_and_kept_whole_in_the_log():
    engine, store, companion = make(budget=600, reserve=120)
    huge = "word " * 3000 + "THE-END"
    result = companion.send(huge)
    assert result.prompt.shortened >= 1
    assert result.stats.prompt_tokens + 120 <= 600
    assert "THE-END" in result.prompt.messages[-1].content  # head and tail kept
    assert store.turns("default")[0].text == huge.strip()


TEA = "The user drinks tea with Ana" + " and tea" * 12  # 124 characters


@pytest.mark.parametrize(
    "raw, expected, reason",
    [
        ("The user's sister is Ana.", "The user's sister is Ana.", "kept"),
        ('  "The user likes tea."  ', "The user likes tea.", "kept"),
        ("NONE", None, "none"),
        ("none.", None, "none"),
        ("None - nothing durable here", None, "none"),
        ("", None, "not_one_line"),
        ("The user likes tea.\nThe user likes cake.", None, "not_one_line"),
        ("x" * 300, None, "not_one_line"),
        # At most 120 characters is a fact; more is a retelling (the design's limit).
        (TEA[:120] + ".", None, "not_one_line"),
        (TEA[:119] + ".", TEA[:119] + ".", "kept"),
        ("The user <|eot_id|> likes tea.", None, "markup"),
        ("<|start_header_id|>system", None, "markup"),
        ("...", None, "no_letters"),
        ("The user's daughter Lily takes violin lessons.", None, "example"),  # an example's fact
        ("I'm glad you found the right spot for your studio.", None, "not_third_person"),
        ("The user dances. The user dances every day.", None, "not_one_sentence"),
        (
            "The user lives in St. Louis near the river.",
            "The user lives in St. Louis near the river.",
            "kept",
        ),
        ("The user is a nurse working night shifts.", None, "ungrounded"),
    ],
)
def test_judge_filters(raw, expected, reason):
    message = "I moved to St. Louis; my flat is near the river. Ana visits and we drink tea."
    assert judge(raw, ["<|eot_id|>"], message)[0] == expected
    assert judge(raw, ["<|eot_id|>"], message) == (expected, reason)


def test_a_fact_about_the_person_the_message_addresses_is_not_about_the_user():
    # Qwen2.5-Coder-1.5B on LoCoMo (benchmarks/README.md): the speaker thanks Gina, and the
    # answer makes Gina the user, or gives her what the user said of themself.
    thanks = "Thanks, Gina! I owe you one. I'll keep practising the cello every day."
    assert judge("The user is named Gina.", (), thanks) == (None, "about_addressee")
    cool = "Cool, Gina! I like all board games, but chess is my favourite. It's so calm."
    assert judge("Gina's favorite game is chess.", (), cool) == (None, "about_addressee")
    # The same model on LoCoMo conv-26: the person thanked becomes a relative of the user, and
    # a message that opens with a name speaks to that person.
    necklace = "Thanks, Gina! This necklace was a gift from my grandma in Sweden."
    fact = "The user's grandmother is called Gina."
    assert judge(fact, (), necklace) == (None, "about_addressee")
    pic = "Gina, that's a great pic! What were they so stoked about?"
    assert judge("Gina was stoked about the picture.", (), pic) == (None, "about_addressee")
    asked = "That photo is from our first contest. Gina, have you ever danced on a stage?"
    fact = "Gina has been in several dance competitions."
    assert judge(fact, (), asked) == (None, "about_addressee")
    cheers = "Yeah, Gina, thanks for always backing me up. Cheers to us!"
    assert judge("The user's sister is called Gina.", (), cheers) == (None, "about_addressee")
    # The same model with the worked examples (one has "The user's daughter Lily ..."): the
    # person spoken to, named anywhere in the fact.
    kids = "Hey Gina! My kids love painting, we spent all Sunday at the art table."
    fact = "The user's daughter Gina enjoys painting."
    assert judge(fact, (), kids) == (None, "about_addressee")
    yeah = "Yeah Gina, let's keep cheering each other on! Thanks for the support."
    assert judge("The user's sister Gina is supportive.", (), yeah)[1] == "about_addressee"
    race = "Wow Gina, so proud of you for finishing the charity race in the rain!"
    assert judge("The user is proud of Gina for the charity race.", (), race)[1] == (
        "about_addressee"
    )
    # A name the message only mentions or talks about is fine, even next to a comma.
    kept = [
        ("My sister Gina moved to Lisbon last spring and I miss her so much.", "The user's "
         "sister Gina lives in Lisbon."),
        ("I am going to see my best friend from college, Maria.", "The user's best friend is "
         "Maria."),
        ("Oh Mark called me yesterday, he is moving to Denver next month!", "The user's friend "
         "Mark is moving to Denver."),
        ("We moved to a flat in the city last weekend, Denver!", "The user moved to Denver."),
        ("Thanks, Gina! My brother Tom starts his new job as a nurse on Monday.", "The user's "
         "brother Tom is a nurse."),
        ("Thanks, Gina! My brother is called Tom and he starts as a nurse on Monday.", "The "
         "user's brother is called Tom."),
        ("Lisbon, the city I grew up in, is where I'm moving back next spring.", "The user "
         "grew up in Lisbon."),
        ("Yesterday I finished Becoming Nicole by Amy Ellis Nutt, it moved me.", "The user read "
         "the book Becoming Nicole by Amy Ellis Nutt."),
        # A name set off by an apposition, or after a greeting's "!", is talked about.
        ("Max, my golden retriever, turned five today!", "The user's dog is called Max."),
        ("Sarah, my older sister, just got engaged to Tom!", "The user's sister is called Sarah."),
        ("Thanks! Bella, our new puppy, chewed through my shoes.", "The user has a puppy named "
         "Bella."),
        ("Hi! Emma started first grade, I'm so proud!", "The user's daughter is named "
         "Emma."),
        ("Thanks, Anna! My daughter is also called Anna, after my mother.", "The user's "
         "daughter is called Anna."),
    ]  # fmt: skip
    for message, fact in kept:
        assert judge(fact, (), message) == (fact, "kept"), message


def test_a_fact_from_sentences_not_in_the_first_person_is_not_the_users_news():
    # As Qwen2.5-Coder-1.5B did with the worked examples: praise and questions for the other
    # person, made into the user's news.
    congrats = "Woohoo! Congrats on the new choir. Which choir did you join in the end?"
    assert judge("The user joined a new choir.", (), congrats) == (None, "not_said_of_self")
    praise = "Awesome! Finishing a marathon in that heat must have been such a rush!"
    assert judge("The user finished a marathon.", (), praise) == (None, "not_said_of_self")
    # The same words in a sentence where the writer speaks of themself are the writer's.
    mine = "Congrats on the new choir! I joined one too, we sing on Tuesdays."
    assert judge("The user joined a choir.", (), mine) == ("The user joined a choir.", "kept")
    ours = "Our choir sings at the town hall on Sunday, so excited."
    assert judge("The user's choir sings at the town hall.", (), ours)[1] == "kept"
    # Strict: news without "I" gives no fact, a fact missed rather than a wrong one.
    terse = "Finished a marathon last weekend, in that heat!"
    assert judge("The user finished a marathon.", (), terse) == (None, "not_said_of_self")


def test_a_fact_that_does_not_name_the_user_is_someone_elses_life():
    # As Qwen2.5-Coder-1.5B did on LoCoMo conv-41: the user speaks to Nadia, and the fact makes
    # her the user.
    cool = "Whoa, Nadia, how fun! Me, I took up fencing and it gives me energy all week."
    assert judge("Nadia is doing fencing.", (), cool) == (None, "not_about_user")
    called = "Oh Mark called me yesterday, he is moving to Denver next month!"
    assert judge("Mark is moving to Denver.", (), called) == (None, "not_about_user")
    for fact in ("The user is doing fencing.", "Fencing gives the user energy."):
        assert judge(fact, (), cool) == (fact, "kept")


def test_every_example_word_is_in_the_examples():
    # is_example reads the examples through EXAMPLE_WORDS: a word left behind by a new
    # example would refuse true facts and let the new example's echo through.
    text = " ".join(f"{message} {answer}" for message, answer in EXAMPLES)
    for word in EXAMPLE_WORDS:
        assert re.search(rf"\b{word}s?\b", text, re.I), word


def test_an_example_name_where_the_message_has_none_is_the_example():
    # As Qwen2.5-Coder-1.5B answered on LoCoMo: an example's name, with a word of the message.
    message = "Sure! It feels like having a partner in all of this!"
    assert judge("The user's partner is called Lily.", (), message) == (None, "example")
    assert judge("The user is moving to Leeds.", (), "Moving is such a partner.")[1] == "example"
    # or an example's thing, given to someone the message names
    lessons = "Thanks Gina, the children loved the concert yesterday evening!"
    assert judge("The user's daughter takes violin lessons.", (), lessons)[1] == "example"
    violin = "My son plays the violin in the school orchestra, concert on Friday."
    assert judge("The user's son plays the violin.", (), violin)[1] == "kept"
    assert judge("The user has a son who plays an instrument.", (), violin)[1] == "kept"
    named = "My partner Lily and I dance every Friday."
    assert judge("The user's partner is called Lily.", (), named)[1] == "kept"
    # Other names need not be spelled in the message as in the fact.
    for message, fact in [
        ("I moved to NYC last year and I love it.", "The user moved to New York City."),
        ("I was born and raised in Canada, near the lakes.", "The user is Canadian."),
    ]:
        assert judge(fact, (), message) == (fact, "kept"), message


def test_the_worked_examples_come_before_the_message_and_their_prefix_is_reused():
    engine = FakeEngine(lambda prompt: "NONE")
    extractor = FactExtractor(engine, budget=1024)
    first = "Last spring I planted tomatoes and beans in the garden behind our house."
    second = "My brother Karl moved to Vienna for work and I visit him every summer."
    assert extractor.extract(first, []).outcome == "none"
    assert extractor.extract(second, []).outcome == "none"
    shown = engine.calls[-1].prompt
    at = 0
    for text, answer in EXAMPLES:  # each example, then its answer, in order, then the message
        at = shown.index(answer, shown.index(text, at))
    assert second in shown[at:]
    # Everything but the message is the same text each time: the second call prefills only it.
    assert extractor.frame == engine.count_chat(extraction_messages(""))
    assert engine.calls[-1].cached_tokens >= extractor.frame - 8
    assert engine.calls[-1].prompt_tokens - engine.calls[-1].cached_tokens <= (
        engine.count_text(second) + 8
    )


def test_a_fact_from_sentences_that_speak_to_the_other_person_is_not_about_the_user():
    asked = "Wow, well done! How did you come to open a bike shop of your own?"
    assert judge("The user opened a bike shop.", (), asked) == (None, "about_addressee")
    praised = "It has been hard. But your shop inspires me. Your patience is amazing!"
    assert judge("The user's patience is amazing.", (), praised) == (None, "about_addressee")
    # A sentence that speaks of the speaker too is the speaker's.
    mixed = "Thanks for your tips, I finally got the job at the bakery!"
    fact = "The user got a job at a bakery."
    assert judge(fact, (), mixed) == (fact, "kept")
    thanks = "Thanks so much, your advice on sleep really helped me a lot this week."
    assert judge("The user appreciates the assistant's advice.", (), thanks) == (
        None,
        "about_assistant",
    )


def test_a_fact_where_the_user_does_something_to_the_user_is_the_other_person_taken_for_them():
    # Qwen2.5-Coder-1.5B on LoCoMo conv-30: the "you" of a sentence written to the other
    # person, turned into the user.
    there = "I'm always here for you, no matter what happens with the studio."
    fact = "The user is always there for the user."
    assert judge(fact, (), there) == (None, "about_addressee")
    # The user's relative doing something for the user is a fact about the user.
    taught = "My mom taught me to paint when I was six."
    fact = "The user's mom taught the user to paint."
    assert judge(fact, (), taught) == (fact, "kept")
    fact = "The user paints with the user's mom on Sundays."
    assert judge(fact, (), "I paint with my mom on Sundays.") == (fact, "kept")


def test_duplicates_after_normalizing_case_punctuation_whitespace_and_containment():
    existing = ["The user's sister is called Ana."]
    assert is_duplicate("the users  sister is called ana", existing)
    assert is_duplicate("The user's sister is called Ana, and she lives in Porto.", existing)
    assert is_duplicate("sister is called Ana", existing)
    assert not is_duplicate("The user's brother is called Rui.", existing)
    assert normalize("Ça   va?!") == "ça va"


def test_an_automatic_fact_that_says_a_kept_one_in_other_words_is_a_duplicate():
    existing = [
        "The user volunteers at the animal shelter on weekends.",
        "The user's brother is Rui.",
    ]
    assert is_duplicate("The user volunteers at an animal shelter every weekend.", existing)
    # one word in three differs: another person, another fact
    assert not is_duplicate(
        "The user's cousin is called Rui.", ["The user's brother is called Rui."]
    )
    assert not is_duplicate("The user adopted a dog from the animal shelter.", existing)


words = st.text(alphabet=st.sampled_from("abcdefgh <|>\n"), min_size=1, max_size=400)


@settings(max_examples=60, deadline=None)
@given(
    turns=st.lists(words.filter(str.strip), min_size=1, max_size=14),
    facts=st.lists(words.filter(str.strip), max_size=8),
    summary=st.one_of(st.none(), words),
    budget=st.integers(min_value=300, max_value=3000),
)
def test_prompt_plus_reserve_never_exceeds_the_budget(turns, facts, summary, budget):
    engine = FakeEngine()
    reserve = budget // 4
    messages = [
        Message("user" if i % 2 == len(turns) % 2 - 1 or i == len(turns) - 1 else "assistant", t)
        for i, t in enumerate(turns)
    ]
    prompt = PromptBudget(engine, budget, reserve).assemble("Be kind.", facts, summary, messages)
    assert len(prompt.tokens) + reserve <= budget
    assert len(prompt.tokens) == len(engine.encode_chat(prompt.messages))
    assert prompt.messages[-1].role == messages[-1].role
    newest = messages[-1].content.strip()
    kept = prompt.messages[-1].content
    # The newest message is in the prompt: whole, or its head and tail around a marker.
    assert kept == messages[-1].content or (
        "left out here" in kept and kept.split("\n[")[0].strip() in newest
    )
    assert sum(prompt.layers.to_dict().values()) == budget
    assert prompt.layers.facts <= int(budget * 0.15)  # the facts share is a cap


def test_many_facts_do_not_force_a_fold_every_turn():
    engine, store, companion = make(budget=1024)
    for i in range(60):
        store.add_fact(f"The user's friend number {i} is called Name{i} and lives far away.")
    results = [companion.send(f"short message {i}") for i in range(6)]
    assert not any(r.folds for r in results)
    assert results[-1].prompt.facts_left_out > 0


def test_a_long_fact_does_not_hide_the_short_ones_after_it():
    engine = FakeEngine()
    budget = PromptBudget(engine, 1000, 100)
    facts = ["word " * 400, "The user likes tea.", "The user is called Ana."]
    assert budget.pack_facts("Be kind.", facts) == facts[1:]


def test_too_small_a_budget_is_refused_up_front_with_the_size_that_works():
    with pytest.raises(InputError, match="use at least") as info:
        make(budget=300, reserve=100)
    assert "--no-recall frees it" in str(info.value)  # recall is on: its room is counted
    enough = int(str(info.value).rsplit(" ", 1)[-1])
    make(budget=enough, reserve=100)  # the suggested size works
    with pytest.raises(InputError, match="use at least") as info:
        make(budget=300, reserve=100, recall=False)
    assert "recall" not in str(info.value)
    assert int(str(info.value).rsplit(" ", 1)[-1]) < enough  # without its room, less will do


def test_fact_extraction_prompt_fits_small_budgets():
    # Without recall, whose share of the budget would need 584 tokens at least.
    engine, _, companion = make(budget=520, reserve=120, recall=False)
    companion.send("My sister Ana lives in Porto. " * 40)
    for call in engine.calls:
        assert call.prompt_tokens + call.max_tokens <= 520


def test_interrupted_reply_is_kept_with_consistent_stats():
    _, store, companion = make()

    def stop_after_first(text):
        raise KeyboardInterrupt

    result = companion.send("Tell me a story", on_text=stop_after_first)
    assert result.interrupted and result.stats.finish_reason == "interrupted"
    assert result.stats.cached_tokens + result.stats.prefilled_tokens == result.stats.prompt_tokens
    last = store.turns("default")[-1]
    assert last.role == "assistant" and last.interrupted and last.sampled_ids is None


def test_user_turns_are_logged_with_their_token_ids():
    """Encoded once: a later prompt takes the logged ids instead of encoding the text again."""
    engine, store, companion = make(budget=2000)
    companion.send("My cat Miso likes sardines.")
    user = store.turns("default")[-2]
    assert user.role == "user" and user.sampled_by == engine.model_id
    assert list(user.sampled_ids) == engine.encode_text("My cat Miso likes sardines.")
    assert user.token_count == len(user.sampled_ids)
    assert companion.window.messages([user])[0].tokens == user.sampled_ids


def test_sampled_reply_ids_are_logged_and_reused_in_the_next_prompt():
    engine, store, companion = make(budget=2000)
    companion.send("hello")
    reply = store.turns("default")[-1]
    assert reply.sampled_by == engine.model_id
    assert list(reply.sampled_ids) == engine.encode_text(
        "That sounds lovely. Tell me more about your afternoon and the sardines."
    )
    # A model that did not write the reply re-tokenizes it instead.
    assert companion.window.messages([reply])[0].tokens == reply.sampled_ids
    assert as_messages([reply], "another-model")[0].tokens is None


# -- deletions racing a turn -------------------------------------------------------------------


def send_while(companion, text, during):
    """Send `text` in a thread; once the model is writing the reply, run `during()`."""
    import threading
    import time

    done = {}

    def turn():
        done["result"] = companion.send(text)

    thread = threading.Thread(target=turn)
    thread.start()
    while not companion.engine.calls:
        time.sleep(0.01)
    during()
    thread.join(timeout=30)
    return done["result"]


def test_a_conversation_deleted_during_the_reply_does_not_come_back(mlxmem_home):
    from conftest import files_containing

    engine = FakeEngine(scripted, delay_s=0.05)
    store = Store()
    companion = Companion(engine, store, "default", 600, 120, ChatSettings())
    with pytest.warns(UserWarning, match="not kept"):
        result = send_while(
            companion,
            "my locker code is MARKER-RACE-3141, and my cat Miso likes sardines a lot",
            lambda: Store().delete_conversation("default"),
        )
    assert result.discarded
    assert store.conversations() == [] and store.facts() == []
    assert files_containing(mlxmem_home, "MARKER-RACE-3141") == []
    companion.send("hello again")  # the next chat starts clean, from seq 1
    assert [(t.seq, t.role) for t in store.turns("default")] == [(1, "user"), (2, "assistant")]


def test_a_fact_deleted_during_a_turn_is_not_in_the_summary_written_after_it():
    engine = FakeEngine(scripted, delay_s=0.002)
    store = Store()
    settings = ChatSettings(extract_facts=False, summary="model")
    companion = Companion(engine, store, "default", 600, 120, settings)
    fact = store.add_fact("Has a parrot called MARKER-PARROT.")
    for i in range(40):  # fold at least twice with the fact in the prompt
        companion.send(user_text(i))
    saw = [s for s in store.summaries("default") if fact.id in s.fact_ids]
    assert saw, "no summary had the fact in its prompt"
    deletion = store.delete_facts([fact.id])
    assert {s.id for s in saw} <= {s.id for s in deletion.summaries}
    companion.send("and now?")  # folds the remaining log again, without the fact
    assert store.summaries("default"), "the summary was not rebuilt"
    for summary in store.summaries("default"):
        assert fact.id not in summary.fact_ids
    summary_prompts = [c.prompt for c in engine.calls if SUMMARY_REQUEST in c.prompt]
    assert "MARKER-PARROT" not in summary_prompts[-1]


def test_an_unanswered_message_keeps_roles_alternating():
    engine, store, companion = make()
    store.append_turn("default", "user", "a message whose reply was killed")
    result = companion.send("are you there?")
    roles = [m.role for m in result.prompt.messages]
    assert roles == ["system", "user", "assistant", "user"]
    assert result.prompt.messages[2].content == UNANSWERED


def test_a_message_over_the_size_limit_is_refused_before_it_is_logged():
    _, store, companion = make(max_message_chars=1000)
    with pytest.raises(InputError, match="over the limit of 1,000"):
        companion.send("x" * 1001)
    assert store.conversations() == []
    companion.send("y" * 1000)
    assert len(store.turns("default")) == 2


def test_a_deletion_drops_the_fact_extractors_slot_at_the_next_turn():
    engine, store, companion = make(budget=2000)
    long = "I have a cat called Miso and she sleeps on the balcony every afternoon, all summer."
    companion.send(long)
    assert "facts" in engine.slots and long in engine.decode(engine.slots["facts"])
    companion.send("Nice weather today.")  # nothing deleted: the extractor's prefix stays
    assert "facts" in engine.slots
    store.delete_turns([store.turns("default")[0].id])  # as `mlxmem history rm` would
    companion.send("And how are you?")  # short: the extractor is not asked, its slot goes
    assert "facts" not in engine.slots


# -- an automatic fact that replaces an older one ----------------------------------------------

MOVED = "The user moved to Porto last spring."
CHESS = "The user plays chess every Sunday."


def replacing(prompt: str) -> str:
    """The extractor notes the move; the replacement check finds the old fact out of date."""
    if "still true" in prompt:
        return "NO." if "Lisbon" in prompt else "YES"
    if "durable facts" in prompt:
        message = prompt.rsplit("user", 1)[-1]
        return MOVED if "Porto" in message else CHESS if "chess" in message else "NONE"
    return "fine."


def test_the_gate_finds_facts_about_the_same_thing_and_the_answer_decides():
    existing = [(1, "The user lives in Lisbon."), (2, "The user has a dog named Rex.")]
    assert replacement_candidates(MOVED, existing) == [(1, "The user lives in Lisbon.")]
    assert replacement_candidates("The user plays chess.", existing) == []
    assert replacement_candidates("The user gave the dog Rex away.", existing)[0][0] == 2
    # Only a fact about the same person or thing: the sister's diet is not the user's.
    diet = [(1, "The user is vegetarian."), (2, "The user's sister is vegetarian.")]
    assert replacement_candidates("The user's sister is vegan now.", diet) == [diet[1]]
    assert not still_true("NO") and not still_true(" no.")
    assert still_true("YES") and still_true("Yes, it is.") and still_true("maybe")


def test_by_default_a_new_fact_replaces_nothing_and_costs_no_check():
    engine, store, companion = make(budget=900, responder=replacing)
    old = store.add_fact("The user lives in Lisbon.", source="automatic")
    result = companion.send("Big news: I moved to Porto last spring and I love the river there.")
    assert result.fact_added.text == MOVED and result.fact_replaced is None
    assert [f.text for f in store.facts()] == ["The user lives in Lisbon.", MOVED]
    assert [f.replaced_by for f in store.facts(replaced=True)] == [None, None]
    assert store.facts()[0].id == old.id
    assert not any("still true" in c.prompt for c in engine.calls)


def test_an_automatic_fact_replaces_an_older_one_which_leaves_the_prompt_at_the_next_fold():
    engine, store, companion = make(budget=900, responder=replacing, replace_facts=True)
    old = store.add_fact("The user lives in Lisbon.", source="automatic")
    result = companion.send("Big news: I moved to Porto last spring and I love the river there.")
    assert result.fact_added.text == MOVED and result.fact_replaced == old.id
    assert [f.text for f in store.facts()] == [MOVED]
    (replaced,) = [f for f in store.facts(replaced=True) if f.id == old.id]
    assert replaced.replaced_by == result.fact_added.id
    # The cached prefix stays put: the old fact leaves when the new one joins, at a fold.
    companion.send("hello")
    assert "Lisbon" in engine.calls[-1].prompt and MOVED not in engine.calls[-1].prompt
    while Store().latest_summary("default") is None:
        companion.send(f"{user_text(len(engine.calls))} and more about my week.")
    companion.send("and now?")
    prompt = [c for c in engine.calls if c.slot == "default/chat"][-1].prompt
    assert MOVED in prompt and "Lisbon" not in prompt
    # No candidate, no second call: a fact on another subject costs one call, as before.
    calls = len(engine.calls)
    result = companion.send("These days I play chess at the club every Sunday with my neighbour.")
    assert result.fact_added.text == CHESS and result.fact_replaced is None
    assert not any("still true" in c.prompt for c in engine.calls[calls:])


def test_a_manual_replacement_leaves_the_prompt_at_once():
    engine, store, companion = make(budget=2000)
    old = store.add_fact("The user lives in Lisbon.", source="automatic")
    companion.send("hi")
    store.add_fact("I moved to Porto", source="manual", replaces=old.id)
    companion.send("hi again")
    assert "Porto" in engine.calls[-1].prompt and "Lisbon" not in engine.calls[-1].prompt


def test_the_whole_reply_is_out_before_the_memory_work_after_it():
    engine, _, companion = make(budget=2000)
    seen: list[tuple[int, list[str]]] = []
    turn = companion.begin("I have a cat called Miso and she is the most important one to me.")
    logged = lambda: [t.role for t in Store().turns("default")]  # noqa: E731
    result = companion.reply(turn, on_written=lambda _: seen.append((len(engine.calls), logged())))
    assert result.fact_added is not None  # the extraction ran, after the reply was out
    assert seen == [(1, ["user", "assistant"])] and len(engine.calls) == 2


def test_the_model_reads_a_message_without_the_name_it_greets():
    # Qwen2.5-Coder-1.5B gave the writer's news to the person greeted (made up here: "Yeah
    # Nadia, I'm hoping to open a bakery" -> about Nadia, refused); without the name it cannot.
    cases = {
        "Hey Gina! My kids love painting.": "Hey! My kids love painting.",
        "Thanks, Gina! I owe you one.": "Thanks! I owe you one.",
        "Yeah Gina, I'm hoping to open a bakery.": "Yeah, I'm hoping to open a bakery.",
        "Yeah, Gina, thanks for always backing me up.": "Yeah, thanks for always backing me up.",
        "Wow Gina, so proud of you! I ran a race too.": "Wow, so proud of you! I ran a race too.",
        # Only where it is greeted: the same name talked about stays, and so does a sentence
        # that opens with a word and a comma ("Cool" is no name), or a name called out.
        "Thanks, Anna! My daughter is also called Anna, after my mother.": "Thanks! My daughter "
        "is also called Anna, after my mother.",
        "Cool, Gina! I like chess.": "Cool, Gina! I like chess.",
        "Max, my golden retriever, turned five today!": "Max, my golden retriever, turned five "
        "today!",
        "Oh Mark called me yesterday, he is moving to Denver!": "Oh Mark called me yesterday, he "
        "is moving to Denver!",
        # A word that runs on after a greeting is no one spoken to.
        "Hi, My name is Ana and I bake bread.": "Hi, My name is Ana and I bake bread.",
        "Hey, Portland was amazing last week!": "Hey, Portland was amazing last week!",
        "Hey Gina's mom called me today.": "Hey Gina's mom called me today.",
        "Hey Mary-Jane! I got the job.": "Hey Mary-Jane! I got the job.",
        "Thanks, Gina": "Thanks",
    }
    for message, read in cases.items():
        assert without_addressee(message) == read
    seen = []

    def extracting(prompt: str) -> str:
        seen.append(prompt)
        return "The user hopes to open a bakery."

    extractor = FactExtractor(FakeEngine(extracting), 2000)
    look = extractor.extract(
        "Yeah Nadia, I'm really hoping to open a bakery in town this spring.", []
    )
    assert look.fact == "The user hopes to open a bakery."
    assert "Yeah, I'm really hoping" in seen[-1] and "Nadia" not in seen[-1]
    # The checks after the answer still read the message as written.
    thanks = "Thanks, Gina! I owe you one. I'll keep practising the cello every day."
    assert (
        FactExtractor(FakeEngine(lambda _: "The user is named Gina."), 2000)
        .extract(thanks, [])
        .outcome
        == "about_addressee"
    )
