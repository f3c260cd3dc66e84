"""Dates as the model reads them: every turn has its time, and whatever shows turns to the model
(the window, recalled turns, summaries) keeps their day, because a quarter of memory questions
are about when. Times are stored in UTC and shown in the device's local time zone, so that a
day changes where the person's day changes."""

from __future__ import annotations

from datetime import datetime

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
