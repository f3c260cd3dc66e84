"""Dates as the model reads them: every turn has its time, and whatever shows turns to the model
(the window, recalled turns, summaries) keeps their day, because a quarter of memory questions
are about when. Times are stored in UTC and shown in the device's local time zone, so that a
day changes where the person's day changes."""

from __future__ import annotations

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
_MONTH_NUMBERS = {name.lower(): n for n, name in enumerate(MONTHS, 1)}
_MONTH = rf"(?P<month>{'|'.join(MONTHS)})"
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>\d{4})"
# "3 June 2023", "3rd of June, 2023", "June 3, 2023", "June 2023"; with its year a month name
# is a month in any case ("june 2023"). A month or a year alone narrows nothing: on LoCoMo's
# development questions it found no more (benchmarks/recall_retrieval.py).
_NAMED_DAY_RES = [
    re.compile(rf"\b{_DAY}(?:\s+of)?\s+{_MONTH},?\s+{_YEAR}\b", re.IGNORECASE),
    re.compile(rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}\b", re.IGNORECASE),
    re.compile(rf"\b{_MONTH},?\s+{_YEAR}\b", re.IGNORECASE),  # a month: after the dates
]
# A day a message names is an anchor, not an exact day: what was said that week ("the weekend
# before 10 April", "two weeks ago, on 3 June": the turn was written around then).
AROUND_A_DAY = timedelta(days=7)

DayRange = tuple[date, date]  # local days, first included, last excluded


def named_days(text: str) -> list[DayRange]:
    """The days `text` names, in order, each once: a date with the week either side of it, a
    month of a given year whole. Dates that do not exist (31 February) are skipped, and so are
    those the store's times cannot reach (the year 1)."""
    found: list[tuple[int, DayRange]] = []
    rest = text  # what each pattern matched is blanked out for the next ones
    for pattern in _NAMED_DAY_RES:
        for match in pattern.finditer(rest):
            year, month = int(match["year"]), _MONTH_NUMBERS[match["month"].lower()]
            try:
                if "day" in pattern.groupindex:
                    named = date(year, month, int(match["day"]))
                    days = (named - AROUND_A_DAY, named + AROUND_A_DAY + timedelta(days=1))
                else:
                    days = (date(year, month, 1), date(year + month // 12, month % 12 + 1, 1))
                for day in days:
                    local_midnight_utc(day)
            except (ValueError, OverflowError):
                continue
            found.append((match.start(), days))
        rest = pattern.sub(lambda match: " " * len(match[0]), rest)
    return list(dict.fromkeys(days for _, days in sorted(found)))


def local_midnight_utc(day: date) -> datetime:
    """The start of a local `day` as the store keeps times: naive UTC. Where a clock change
    skips midnight (Santiago, Cairo), the day starts at the first time it has."""
    for fold in (0, 1):
        start = datetime.combine(day, time(fold=fold)).astimezone()  # naive: read as local
        if start.date() == day:
            break
    return start.astimezone(timezone.utc).replace(tzinfo=None)
