"""The three F1 scores of `mlxmem eval locomo` on hand-worked answers: `f1` (LoCoMo's rules,
unstemmed), `f1_locomo` (LoCoMo's rules, Porter-stemmed, as its script) and `f1_amem` (A-Mem's
set F1). Every expected value is worked out in the comment beside it."""

import pytest

from mlxmem.eval import locomo as ev


def scores(prediction: str, answer: str, category: int) -> dict[str, float]:
    return ev.answer_scores(prediction, ev.Question("q", answer, category, ()))


def test_stemming_matches_a_word_to_its_stem():
    assert ev.token_f1("adopted", "adopt") == 0.0
    assert ev.token_f1("adopted", "adopt", stem=True) == 1.0
    assert ev.answer_tokens("The kids adopted puppies", stem=True) == ["kid", "adopt", "puppi"]
    # "she adopted puppy" against "adopt puppy" (the article out): unstemmed 1 word in common,
    # P 1/3, R 1/2, F1 2/5; stemmed 2, P 2/3, R 1, F1 4/5. A-Mem: {she, adopted, a, puppy}
    # against {adopt, puppy}: 1 in common, P 1/4, R 1/2, F1 1/3.
    assert scores("She adopted a puppy", "adopt puppy", 4) == {
        "f1": pytest.approx(2 / 5),
        "f1_locomo": pytest.approx(4 / 5),
        "f1_amem": pytest.approx(1 / 3),
        "exact": 0.0,
    }


def test_amem_counts_a_repeated_word_once_and_keeps_articles():
    # Sets: {the, cat} both; LoCoMo's bag: "cat cat" against "cat", P 1/2, R 1, F1 2/3.
    assert ev.amem_f1("the cat the cat", "the cat") == 1.0
    assert ev.token_f1("the cat the cat", "the cat") == pytest.approx(2 / 3)
    # {a, dog} against {dog}: P 1/2, R 1, F1 2/3; LoCoMo drops the article: 1.
    assert ev.amem_f1("a dog", "dog") == pytest.approx(2 / 3)
    assert ev.token_f1("a dog", "dog") == 1.0
    # A bag of 3 against a bag of 3 sharing 2 (F1 2/3); the same two words as sets (F1 1).
    assert ev.token_f1("cat cat dog", "cat dog dog") == pytest.approx(2 / 3)
    assert ev.amem_f1("cat cat dog", "cat dog dog") == 1.0


def test_amem_splits_at_its_four_marks_only_and_does_not_stem():
    assert ev.amem_words("Paris,London! Yes? Jon's.") == {"paris", "london", "yes", "jon's"}
    assert ev.amem_f1("Paris,London", "paris london") == 1.0
    assert ev.amem_f1("Jon's", "Jon") == 0.0  # the apostrophe stays
    assert ev.amem_f1("adopted", "adopt") == 0.0
    assert ev.amem_f1("", "Paris") == ev.amem_f1("Paris", "") == 0.0


def test_multi_hop_splits_the_gold_answer_at_commas_stemmed_or_not():
    # Gold parts hiking, painting, swimming; answer parts "painting", "hiked". Unstemmed:
    # painting 1, the others 0: 1/3. Stemmed ("hike", "paint", "swim"): hiking and painting
    # 1: 2/3. A-Mem, one set each: {painting, hiked} against {hiking, painting, swimming},
    # P 1/2, R 1/3, F1 2/5.
    assert scores("painting, hiked", "hiking, painting, swimming", 1) == {
        "f1": pytest.approx(1 / 3),
        "f1_locomo": pytest.approx(2 / 3),
        "f1_amem": pytest.approx(2 / 5),
        "exact": 0.0,
    }


def test_open_domain_takes_the_first_answer_and_amem_the_whole():
    # LoCoMo: "likely yes" against "yes", P 1, R 1/2, F1 2/3. A-Mem's words of the whole
    # answer are {likely, yes;, she, loves, dogs}: ';' splits nothing, so "yes" is not there.
    assert scores("Yes", "Likely yes; she loves dogs", 3) == {
        "f1": pytest.approx(2 / 3),
        "f1_locomo": pytest.approx(2 / 3),
        "f1_amem": 0.0,
        "exact": 0.0,
    }


def test_adversarial_is_said_none_for_locomo_and_the_unheld_answer_for_amem():
    said_none = scores("Not mentioned in the conversation.", "Rex", 5)
    assert said_none == {"f1": 1.0, "f1_locomo": 1.0, "f1_amem": 0.0, "exact": 1.0}
    assert scores("Rex", "Rex", 5) == {"f1": 0.0, "f1_locomo": 0.0, "f1_amem": 1.0, "exact": 0.0}


def test_exact_match_and_the_unstemmed_f1_are_as_before():
    assert ev.score("19 January, 2023", ev.Question("q", "19 January 2023", 2, ())) == (1.0, 1.0)
    assert scores("in Paris", "Paris", 4) == {
        "f1": pytest.approx(2 / 3),  # P 1/2, R 1
        "f1_locomo": pytest.approx(2 / 3),
        "f1_amem": pytest.approx(2 / 3),
        "exact": 0.0,
    }


def test_rescore_scores_a_stored_answer_anew():
    item = {"question": "q", "answer": "adopt puppy", "category": 4}
    item["recall"] = {"answer": "She adopted a puppy", "f1": 0.4, "exact": 0.0}
    item["window"] = {"answer": None, "f1": None, "exact": None}  # --no-answers: as it was
    ev.rescore(item)
    assert item["recall"]["f1_locomo"] == pytest.approx(4 / 5)
    assert item["recall"]["f1_amem"] == pytest.approx(1 / 3)
    assert item["window"] == {"answer": None, "f1": None, "exact": None}


def test_amem_published_row_sits_beside_our_f1_amem_by_category_number():
    assert ev.AMEM_QWEN25_1_5B_F1 == {1: 18.2, 2: 24.3, 3: 16.5, 4: 23.6}
    cells = {c: {"mean": m} for c, m in [("multi_hop", 0.25), ("single_hop", 0.5)]}
    results = {"configs": ["recall"], "recall": {"f1_amem": cells}}
    assert ev.beside_amem(results) == {
        "recall": {1: 25.0, 2: None, 3: None, 4: 50.0},
        ev.AMEM_ROW_LABEL: {1: 18.2, 2: 24.3, 3: 16.5, 4: 23.6},
    }
