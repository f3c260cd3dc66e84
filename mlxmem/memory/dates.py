"""Dates as the model reads them: every turn has its time, and whatever shows turns to the model
(the window, recalled turns, summaries) keeps their day, because a quarter of memory questions
are about when. Times are stored in UTC and shown in the device's local time zone, so that a
day changes where the person's day changes."""

from __future__ import annotations

from datetime import datetime


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
