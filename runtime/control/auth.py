"""Who may call the coordinator: the run secret, the keys derived from it, and signed reads.

Every signed request is checked against a key derived from `run_dir/secret` (see
`runtime.protocol`): `control` for the operator's commands, `replica-K` for replica K's
reports. `ensure_secret` creates the secret (0600) or refuses one that others can read.
`RequestAuth` caches the derived keys and remembers the nonces of signed GETs, which are not
journaled (a replayed read changes nothing) but must still be refused while their signature is
fresh; a signed write's nonce is journaled with its event instead.
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path

from runtime.protocol import MAX_CLOCK_SKEW_S, derive_key
from slurm.errors import EnvironmentProblem
from slurm.rundir import create_secret, read_secret

SECRET_FILE = "secret"
#: Derived keys kept in memory: the control key and every replica's of a large run.
MAX_CACHED_KEYS = 8192


def ensure_secret(run_dir: Path) -> bytes:
    """The run secret; created (0600) if missing, refused if others can read it."""
    path = run_dir / SECRET_FILE
    if not path.exists():
        return create_secret(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise EnvironmentProblem(f"{path} has mode {mode:o}; it must be 0600 (chmod 600 {path})")
    return read_secret(path)


class RequestAuth:
    """The keys requests are verified with, and the nonces of signed reads seen lately."""

    def __init__(self, secret: bytes, clock: Callable[[], float]) -> None:
        self.secret = secret
        self.clock = clock
        self._keys: dict[str, bytes] = {}
        #: Nonces of signed GETs (not journaled: a replayed read changes nothing).
        self._read_nonces: dict[str, float] = {}

    def key(self, key_id: str) -> bytes:
        """The key for `key_id`; remembered for the first `MAX_CACHED_KEYS` ids asked for.

        A key id is asked for before the signature is checked, so a stranger chooses it (any
        of a million `replica-N`): past the bound a key is derived again each time (one HMAC)
        instead of growing the cache.
        """
        found = self._keys.get(key_id)
        if found is None:
            found = derive_key(self.secret, key_id)
            if len(self._keys) < MAX_CACHED_KEYS:
                self._keys[key_id] = found
        return found

    def read_nonce_seen(self, nonce: str) -> bool:
        return nonce in self._read_nonces

    def remember_read(self, nonce: str, sent: float) -> None:
        """Keep a signed read's nonce for as long as its signature could be replayed."""
        if len(self._read_nonces) >= 10_000:
            self.prune()
        self._read_nonces[nonce] = sent

    def prune(self) -> None:
        """Forget the nonces of reads whose signatures are too old to be accepted again."""
        now = self.clock()
        self._read_nonces = {
            n: t for n, t in self._read_nonces.items() if now - t <= 2 * MAX_CLOCK_SKEW_S
        }
