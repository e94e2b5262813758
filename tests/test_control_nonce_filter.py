"""The journal's nonce filter: a nonce it drops is never one the table still needs, a false
positive only costs a lookup, and a reopened journal knows its nonces again."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest

from runtime.control.journal.nonce_filter import NonceFilter
from runtime.control.journal.store import Journal
from runtime.control.journal.writer import NONCE_KEEP_S, GroupWriter
from runtime.control.policy import Tick

KEEP = 600.0


@pytest.mark.parametrize(
    ("stored_at", "later_at", "held"),
    [
        (0.0, None, True),  # alone in its generation
        (10.0, 599.0, True),  # same generation
        (10.0, 600.0, True),  # the next generation: kept as the previous one
        (599.0, 1199.0, True),  # 600 s later, still the previous generation
        (599.0, 1200.0, False),  # two generations on: older than keep_s, dropped
        (10.0, 5000.0, False),  # a jump of many generations drops both
        (1000.0, 700.0, True),  # a clock stepped back: the new nonce goes into the current one
    ],
)
def test_a_nonce_is_held_for_at_least_keep_s(
    stored_at: float, later_at: float | None, held: bool
) -> None:
    f = NonceFilter(KEEP)
    f.add("stored", stored_at)
    if later_at is not None:
        f.add("later", later_at)
        assert f.may_contain("later")
    assert f.may_contain("stored") is held


def test_a_nonce_stored_at_an_older_time_stays_in_the_current_generation() -> None:
    f = NonceFilter(KEEP)
    f.add("now", 1000.0)
    f.add("older", 100.0)  # loaded out of order, or a clock stepped back
    f.add("next", 1300.0)  # generation 2: the current one (1) becomes the previous
    assert f.may_contain("older") and f.may_contain("now")


def test_false_positives_are_few_at_a_full_generation() -> None:
    """1,000 nonces a second for 600 s in a 2**24-bit generation: about 0.5 % false positives."""
    f = NonceFilter(KEEP)
    stored = [secrets.token_hex(12) for _ in range(600_000)]
    for i, nonce in enumerate(stored):
        f.add(nonce, 0.001 * i)
    assert all(f.may_contain(n) for n in stored[::97])
    fresh = [secrets.token_hex(12) for _ in range(20_000)]
    rate = sum(f.may_contain(n) for n in fresh) / len(fresh)
    assert rate < 0.02, rate


@pytest.mark.parametrize(("keep_s", "bits"), [(0.0, 24), (-1.0, 24), (600.0, 2), (600.0, 32)])
def test_bad_sizes_are_refused(keep_s: float, bits: int) -> None:
    with pytest.raises(ValueError):
        NonceFilter(keep_s, bits)


def test_a_false_positive_is_answered_by_the_table(tmp_path: Path) -> None:
    """A filter whose every bit is set says "maybe" to every nonce: the table decides."""
    journal = Journal(tmp_path / "journal.sqlite")
    journal.nonces = NonceFilter(NONCE_KEEP_S, bits_log2=3)
    for k in range(64):
        journal.nonces.add(f"fill{k}", 0.0)
    assert journal.nonces.may_contain("never-stored")
    assert not journal.nonce_seen("never-stored")
    journal.record(Tick(1.0), [], nonce="stored")
    assert journal.nonce_seen("stored")
    journal.close()


def test_a_reopened_journal_knows_its_nonces(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    journal = Journal(path)
    journal.filter_nonces()
    journal.record(Tick(1.0), [], nonce="before-restart")
    journal.close()
    again = Journal(path)
    assert again.nonces is None  # a reader of the journal does not build it
    assert again.nonce_seen("before-restart")
    again.filter_nonces()
    assert again.nonces is not None and again.nonces.may_contain("before-restart")
    assert again.nonce_seen("before-restart")
    with pytest.raises(KeyError):
        again.record(Tick(2.0), [], nonce="before-restart")
    again.close()


def test_the_group_writer_remembers_a_nonce_before_its_commit(tmp_path: Path) -> None:
    """Queued, committed, and after its pending entry is gone: still refused as a replay."""

    async def run() -> None:
        journal = Journal(tmp_path / "journal.sqlite")
        journal.filter_nonces()
        writer = GroupWriter(journal)
        _, _, committed = writer.record(Tick(1.0), [], nonce="queued", durable=True)
        assert journal.nonce_seen("queued")  # pending
        assert committed is not None
        await committed
        assert "queued" not in writer.pending_nonces
        assert journal.nonces is not None and journal.nonces.may_contain("queued")
        assert journal.nonce_seen("queued")
        with pytest.raises(KeyError):
            writer.record(Tick(2.0), [], nonce="queued")
        assert not journal.nonce_seen("other")
        await writer.close()
        journal.close()

    asyncio.run(run())
