"""Pages of ``GET /jobs`` (design note 029): keyset pagination by job number.

A page is at most ``limit`` job views, in job-number order (the order of the unpaged
list), after the job a cursor names. The cursor is opaque to clients: URL-safe base64
of ``v1:<number>``, the number of the last job the page looked at. Numbers only grow
(``Store.next_job_number``), so a job submitted between two pages can only come on a
later page and no job is listed twice.
"""

from __future__ import annotations

import base64
import binascii
import re
from bisect import bisect_right
from typing import TYPE_CHECKING

from gpushepherd.daemon.arrays import parse_child_id
from gpushepherd.daemon.jobquery import JobFilter, QueryError

if TYPE_CHECKING:
    from gpushepherd.daemon.server import Daemon

#: the jobs of one page by default, and at most
PAGE_LIMIT, MAX_PAGE_LIMIT = 500, 5000
#: the most jobs one page looks at (then it ends short, with a ``next``): a filter that
#: matches few jobs costs a bounded walk per page, not one over the whole queue
MIN_SCAN = 20_000
SCAN_PER_LIMIT = 40
_VERSION = "v1:"
_NUMBER = re.compile(r"0|[1-9][0-9]{0,17}")


def encode_cursor(num: int) -> str:
    """The cursor of the page after job number ``num``."""
    return base64.urlsafe_b64encode(f"{_VERSION}{num}".encode()).decode().rstrip("=")


def decode_cursor(text: str) -> int:
    """The job number a cursor of ``encode_cursor`` names.

    Raises:
        QueryError: (field ``cursor``) anything else, naming the value and what is allowed.
    """
    why = f"{text[:200]!r} is not allowed: the 'next' value of an earlier page of GET /jobs"
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise QueryError("cursor", why) from None
    if not raw.startswith(_VERSION) or not _NUMBER.fullmatch(raw[len(_VERSION):]):
        raise QueryError("cursor", why)
    return int(raw[len(_VERSION):])


def parse_limit(text: str) -> int:
    """The page size of ``limit=text``: a whole number 1..``MAX_PAGE_LIMIT``.

    Raises:
        QueryError: (field ``limit``) anything else, naming the value and what is allowed.
    """
    t = text.strip()
    if not re.fullmatch(r"[0-9]{1,9}", t) or not 1 <= int(t) <= MAX_PAGE_LIMIT:
        raise QueryError("limit", f"{text[:200]!r} is not allowed: a whole number from 1 to {MAX_PAGE_LIMIT:,} "
                                  f"(jobs per page; default {PAGE_LIMIT})")
    return int(t)


class JobIndex:
    """Every job's and array's ``(number, id)``, sorted by number, in memory: read whole
    once, then only the rows numbered above the highest seen (``Store.job_numbers``).
    Refreshed under the daemon's lock, so a step's rows are all there or none."""

    def __init__(self, store):
        self.store = store
        self.nums: list[int] = []
        self.ids: list[str] = []

    def refresh(self) -> None:
        """Add the jobs numbered above the highest seen."""
        for num, job_id in self.store.job_numbers(self.nums[-1] if self.nums else 0):
            self.nums.append(num)
            self.ids.append(job_id)


def page(daemon: Daemon, index: JobIndex, keep: JobFilter, limit: int, after: int,
         children: bool = False) -> tuple[list[dict], int | None]:
    """One page: the views of at most ``limit`` jobs numbered above ``after`` that
    ``keep`` lets through (arrays' children only with ``children``), and the number to
    continue after (``None``: no job is numbered above the last one looked at). Looks at
    most ``max(MIN_SCAN, SCAN_PER_LIMIT x limit)`` jobs: a page may be short with a next
    number. Call it with the daemon's lock held."""
    index.refresh()
    nums, ids = index.nums, index.ids
    i = bisect_right(nums, after)
    budget = i + max(MIN_SCAN, SCAN_PER_LIMIT * limit)
    picked: list[str] = []
    while i < len(nums) and len(picked) < limit and i < budget:
        job_id = ids[i]
        i += 1
        if not children and "_" in job_id and (c := parse_child_id(job_id)) and c[0] in daemon.arrays:
            continue
        state = daemon.job_state(job_id)
        if state is None or not keep.match(state, lambda f, j=job_id: daemon.job_field(j, f)):
            continue
        picked.append(job_id)
    views = daemon.views_of(picked)
    return views, (nums[i - 1] if i < len(nums) else None)
