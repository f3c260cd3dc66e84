"""Dates as the model reads them: every turn has its time, and whatever shows turns to the model
(the window, recalled turns, summaries) keeps their day, because a quarter of memory questions
are about when. Times are stored in UTC and shown in the device's local time zone, so that a
day changes where the person's day changes."""

from __future__ import annotations

import functools
import re
from datetime import date, datetime, time, timedelta, timezone

# When the first and the last of a run of turns were written (a summary's, say).
Span = tuple[datetime, datetime]


def local_day(when: datetime) -> datetime:
    """`when` (timezone-aware) in the device's local time zone."""
    return when.astimezone()


def day_label(when: datetime) -> str:
    """The day of `when`, as a prompt shows it: "8 May 2023" (no weekday: a small model copies
    what it reads, and a wrong weekday would be worse than none)."""
    day = local_day(when)
    return f"{day.day} {day:%B %Y}"


def same_day(a: datetime, b: datetime) -> bool:
    return local_day(a).date() == local_day(b).date()


def day_marker(when: datetime) -> str:
    """The first line of a message written on a new day: "[8 May 2023]"."""
    return f"[{day_label(when)}]"


def day_range(first: datetime, last: datetime) -> str:
    """The days from `first` to `last`: "8 May 2023", or "8 May 2023 to 25 May 2023"."""
    if same_day(first, last):
        return day_label(first)
    return f"{day_label(first)} to {day_label(last)}"


def dated(text: str, when: datetime) -> str:
    """A message's text as shown when its day differs from the message before it."""
    return f"{day_marker(when)}\n{text}"


MONTHS = (
    "January February March April May June July August September October November December"
).split()
WEEKDAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()  # date.weekday()
_MONTH_NUMBERS = {name.lower(): n for n, name in enumerate(MONTHS, 1)}
_MONTH = rf"(?P<month>{'|'.join(MONTHS)})"
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>\d{4})"
# "3 June 2023", "3rd of June, 2023", "June 3, 2023", "June 2023"; with its year a month name
# is a month in any case ("june 2023"). A month or a year alone narrows nothing: on LoCoMo's
# development questions it found no more (benchmarks/recall_retrieval.py).
# ASCII: with IGNORECASE alone, "ſ" and "ı" match "s" and "i" and the names read back miss.
_FLAGS = re.IGNORECASE | re.ASCII
_NAMED_DAY_RES = [
    re.compile(rf"\b{_DAY}(?:\s+of)?\s+{_MONTH},?\s+{_YEAR}\b", _FLAGS),
    re.compile(rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}\b", _FLAGS),
    re.compile(rf"\b{_MONTH},?\s+{_YEAR}\b", _FLAGS),  # a month: after the dates
]
# A day a message names is an anchor, not an exact day: what was said that week ("the weekend
# before 10 April", "two weeks ago, on 3 June": the turn was written around then).
AROUND_A_DAY = timedelta(days=7)

DayRange = tuple[date, date]  # local days, first included, last excluded


_NUMBER_WORDS = "one two three four five six seven eight nine ten eleven twelve".split()
_COUNTS = {"a": 1, "an": 1, "a couple of": 2, "a few": 3} | {
    word: n for n, word in enumerate(_NUMBER_WORDS, 1)
}
_COUNT = rf"(?P<n>\d{{1,3}}|an?|{'|'.join(_NUMBER_WORDS)}|a\s+couple\s+of|a\s+few)"
_WEEKDAY_NUMBERS = {name.lower(): n for n, name in enumerate(WEEKDAYS)}
_UNIT_END = r"\b(?!-)(?!\s+of\b)"  # not "last week-long", "the last Friday of May"
# Days said relative to when the message is written ("yesterday", "two weeks ago", "last
# month", "the past year", "last Friday"), read only when that day is known (a live chat's
# message). Each is generous, as a named date is: a boost for the turns written then, not a
# filter.
_RELATIVE_RES = [
    re.compile(r"\b(?P<before>the\s+day\s+before\s+)?yesterday\b", _FLAGS),
    re.compile(rf"\b{_COUNT}\s+(?P<unit>day|week|month|year)s?{_UNIT_END}\s+ago\b", _FLAGS),
    re.compile(
        rf"\b(?P<the>the\s+)?(?P<which>last|past|previous)\s+(?P<unit>week|weekend|month|year)"
        rf"{_UNIT_END}",
        _FLAGS,
    ),
    re.compile(rf"\blast\s+(?P<weekday>{'|'.join(WEEKDAYS)}){_UNIT_END}", _FLAGS),
]
_ROLLING_DAYS = {"week": 7, "weekend": 7, "month": 31, "year": 366}


def _whole_month(year: int, month: int) -> DayRange:
    """The local days of a month: its first, and the first of the next."""
    return date(year, month, 1), date(year + month // 12, month % 12 + 1, 1)


def _relative_days(match: re.Match, today: date) -> DayRange:
    """The local days a relative phrase `match` names, seen from `today`."""
    one = timedelta(days=1)
    groups = match.groupdict()
    if "weekday" in groups:  # "last Friday": the latest one before today
        back = (today.weekday() - _WEEKDAY_NUMBERS[match["weekday"].lower()] - 1) % 7 + 1
        return today - back * one, today - (back - 1) * one
    if "unit" not in groups:  # yesterday, or the day before
        back = 2 if match["before"] else 1
        return today - back * one, today - (back - 1) * one
    unit = match["unit"].lower()
    if "which" in groups:
        if match["the"] or match["which"].lower() == "past":  # "the past month": until today
            return today - _ROLLING_DAYS[unit] * one, today + one
        if unit == "week":
            return today - 14 * one, today
        if unit == "weekend":  # the Saturday and Sunday of the latest weekend before today
            back = (today.weekday() - 5) % 7 + (7 if today.weekday() >= 5 else 0)
            return today - back * one, today - (back - 2) * one
        if unit == "month":
            before = today.replace(day=1) - one
            return _whole_month(before.year, before.month)
        return date(today.year - 1, 1, 1), date(today.year, 1, 1)
    word = " ".join(match["n"].lower().split())
    n = int(word) if word.isdigit() else _COUNTS[word]
    if n < 1:
        raise ValueError("no day is 0 days ago")
    if unit == "day":  # a day either side
        return today - (n + 1) * one, today - (n - 2) * one
    if unit == "week":  # a week either side
        return today - (7 * n + 7) * one, today - (7 * n - 8) * one
    if unit == "month":  # half a month either side
        return today - (30 * n + 15) * one, today - (30 * n - 16) * one
    return date(today.year - n, 1, 1), date(today.year - n + 1, 1, 1)


def _days(match: re.Match) -> DayRange:
    """The local days a date or a month of a year `match` names."""
    year, month = int(match["year"]), _MONTH_NUMBERS[match["month"].lower()]
    if match.re.groupindex.get("day"):
        named = date(year, month, int(match["day"]))
        return named - AROUND_A_DAY, named + AROUND_A_DAY + timedelta(days=1)
    return _whole_month(year, month)


def named_days(text: str, today: date | None = None) -> list[DayRange]:
    """The days `text` names, in order, each once: a date with the week either side of it, a
    month of a given year whole, and, when `today` (the local day the text was written) is
    given, the days it names relative to it ("yesterday", "three weeks ago", "last month").
    Dates that do not exist (31 February) are skipped, and so are those the store's times
    cannot reach (the year 1)."""
    readers = [(p, _days) for p in _NAMED_DAY_RES]
    if today is not None:
        relative = functools.partial(_relative_days, today=today)
        readers = [(p, relative) for p in _RELATIVE_RES] + readers
    found: list[tuple[int, DayRange]] = []
    rest = text  # what each pattern matched is blanked out for the next ones
    for pattern, read in readers:
        for match in pattern.finditer(rest):
            try:
                days = read(match)
                for day in days:
                    local_midnight_utc(day)
            except (ValueError, OverflowError):
                continue
            found.append((match.start(), days))
        rest = pattern.sub(lambda match: " " * len(match[0]), rest)
    return list(dict.fromkeys(days for _, days in sorted(found)))


def anchored(text: str, when: datetime) -> str:
    """`text`, written at `when`, with each day it names relative to then followed by that day
    said outright: "last week (the week before 16 June 2023)", "yesterday (15 June 2023)",
    "two weeks ago (two weeks before 11 August 2023)". For turns shown out of their place (a
    recalled turn): a small model copies what it reads, and told only "last week" it answers
    "last week". The temporal anchoring of TimeML-style normalizers, done with the phrases
    named_days reads; as vague as the phrase is ("the week before"), no more precise."""
    today = local_day(when).date()
    found: list[tuple[int, int, str]] = []
    rest = text
    for pattern in _RELATIVE_RES:
        for match in pattern.finditer(rest):
            try:
                said = _said_outright(match, today)
            except (ValueError, OverflowError):
                continue
            found.append((match.start(), match.end(), said))
        rest = pattern.sub(lambda match: " " * len(match[0]), rest)
    for _, end, said in sorted(found, reverse=True):
        text = f"{text[:end]} ({said}){text[end:]}"
    return text


_MONTH_NAME = f"(?:{'|'.join(MONTHS)})"
_A_DAY = rf"\d{{1,2}} {_MONTH_NAME} \d{{4}}"
# What anchored() adds after a phrase: " (the week before 16 June 2023)", " (15 June 2023)".
_ANCHOR_RE = re.compile(
    rf" \((?:the (?:day|week|weekend|month|year) before {_A_DAY}"
    rf"|[\w ]+ (?:day|week|month|year)s? before {_A_DAY}|{_A_DAY}|{_MONTH_NAME} \d{{4}}|\d{{4}})\)"
)


def unanchored(text: str) -> str:
    """`text` without what anchored() added (to find a turn's own words in a prompt)."""
    return _ANCHOR_RE.sub("", text)


def _label(day: date) -> str:
    return f"{day.day} {MONTHS[day.month - 1]} {day.year}"


def _said_outright(match: re.Match, today: date) -> str:
    """The day a relative phrase `match` names, seen from `today`, as words: a day where the
    phrase names one, else the span it names against `today`'s date."""
    groups = match.groupdict()
    if "weekday" in groups or "unit" not in groups:  # "last Friday", "yesterday": one day
        return _label(_relative_days(match, today)[0])
    unit = match["unit"].lower()
    if "which" in groups:
        if unit == "month" and not match["the"] and match["which"].lower() != "past":
            first, _ = _relative_days(match, today)
            return f"{MONTHS[first.month - 1]} {first.year}"
        if unit == "year" and not match["the"] and match["which"].lower() != "past":
            return str(today.year - 1)
        return f"the {unit} before {_label(today)}"
    count = " ".join(match["n"].split())
    _relative_days(match, today)  # refuses "0 days ago"
    plural = "" if count.lower() in ("1", "a", "an", "one") else "s"
    return f"{count} {unit}{plural} before {_label(today)}"


def local_midnight_utc(day: date) -> datetime:
    """The start of a local `day` as the store keeps times: naive UTC. Where a clock change
    skips midnight (Santiago, Cairo), the day starts at the first time it has."""
    for fold in (0, 1):
        start = datetime.combine(day, time(fold=fold)).astimezone()  # naive: read as local
        if start.date() == day:
            break
    return start.astimezone(timezone.utc).replace(tzinfo=None)
