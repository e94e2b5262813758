"""A tiny persistent store for what one run must remember for the next.

Counter growth (ECC correctable rate, NVLink error growth) and "N consecutive passes before
resume" need the previous run's numbers. Prolog, epilog and HealthCheckProgram are separate
processes, so the numbers live in one JSON file under `state_dir`. When the directory is not
writable (a user running `fthsdp check`), the store keeps values in memory only, which is also
what the in-job watchdog wants between its calls.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

_MEMORY: dict[str, dict[str, Any]] = {}
_LOCK = threading.Lock()


class StateStore:
    def __init__(self, directory: str | Path | None) -> None:
        self.path = Path(directory) / "state.json" if directory else None
        self._key = str(self.path) if self.path else "<memory>"

    def _load(self) -> dict[str, Any]:
        if self.path is not None:
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(self.path.read_text())
                if isinstance(data, dict):
                    return data
        return dict(_MEMORY.get(self._key, {}))

    def get(self, key: str, default: Any = None) -> Any:
        with _LOCK:
            return self._load().get(key, default)

    def put(self, key: str, value: Any) -> None:
        with _LOCK:
            data = self._load()
            data[key] = value
            _MEMORY[self._key] = data
            if self.path is None:
                return
            with contextlib.suppress(OSError):
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".state")
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f)
                os.replace(tmp, self.path)
