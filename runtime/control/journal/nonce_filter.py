"""A Bloom filter in memory in front of the journal's nonce table.

Nearly every signed request carries a nonce never seen before, and proving that from SQLite
took a query on the event loop, twice per report (the early replay check, then the one in the
write): about a seventh of the coordinator's time per report at its capacity. The filter
answers "certainly not seen" for almost all of them without touching the database; "maybe"
(every nonce that was stored, and a few percent of the others at most) still asks SQLite, so a
false positive costs one query and never refuses a request.

A nonce is stored for `keep_s` seconds (`NONCE_KEEP_S`: requests signed earlier are refused as
stale before their nonce is looked up). The filter keeps two generations of `keep_s` each, by
the time the nonce was stored: a nonce stays in it for at least `keep_s`, and what is older
falls out without a deletion (a Bloom filter cannot delete). Memory is fixed: two bit arrays of
`2**bits_log2` bits (4 MiB at the default), whatever the rate.

The bit positions come from Python's `hash` of the nonce, which is keyed per process
(PYTHONHASHSEED is random), so a sender cannot aim its nonces at chosen bits; only holders of a
run's key get this far anyway.
"""

from __future__ import annotations

#: Bits per generation (log2): 2**24 bits is 2 MiB. Over both generations, about 1 % false
#: positives at 1,000 new nonces a second kept 600 s, about 4 % at 2,000.
DEFAULT_BITS_LOG2 = 24


class NonceFilter:
    """Which nonces may have been stored in the last `keep_s` seconds (or more)."""

    def __init__(self, keep_s: float, bits_log2: int = DEFAULT_BITS_LOG2) -> None:
        if keep_s <= 0:
            raise ValueError(f"keep_s must be positive, got {keep_s}")
        if not 3 <= bits_log2 <= 31:
            raise ValueError(f"bits_log2 must be in 3..31, got {bits_log2}")
        self.keep_s = keep_s
        self._mask = (1 << bits_log2) - 1
        self._current = bytearray(1 << (bits_log2 - 3))
        self._previous = bytearray(1 << (bits_log2 - 3))
        #: The generation (time // keep_s) `_current` holds; None before the first add.
        self._generation: int | None = None

    def _positions(self, nonce: str) -> tuple[int, int]:
        h = hash(nonce) & 0xFFFFFFFFFFFFFFFF
        return h & self._mask, (h >> 32) & self._mask

    def add(self, nonce: str, at: float) -> None:
        """Remember `nonce`, stored at wall time `at` (the time the journal's row carries)."""
        generation = int(at // self.keep_s)
        if self._generation is None:
            self._generation = generation
        elif generation > self._generation:
            # The previous generation's nonces are all older than keep_s now: drop them.
            if generation == self._generation + 1:
                self._previous = self._current
            else:
                self._previous = bytearray(len(self._current))
            self._current = bytearray(len(self._previous))
            self._generation = generation
        # An older time (a clock stepped back, rows loaded out of order) goes into the current
        # generation, which keeps it longer than needed: never shorter.
        a, b = self._positions(nonce)
        self._current[a >> 3] |= 1 << (a & 7)
        self._current[b >> 3] |= 1 << (b & 7)

    def may_contain(self, nonce: str) -> bool:
        """False: `nonce` was certainly not added in the last `keep_s` seconds. True: ask the
        table."""
        a, b = self._positions(nonce)
        for bits in (self._current, self._previous):
            if bits[a >> 3] & (1 << (a & 7)) and bits[b >> 3] & (1 << (b & 7)):
                return True
        return False
