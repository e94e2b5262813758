"""The coordinator's answers are signed for the request they answer, and a supervisor believes
only an answer that verifies for its own nonce with every field in range."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from control_harness import RecordingBackend

from runtime.control.http import start_coordinator
from runtime.control.policy import PolicyConfig
from runtime.control.settings import CoordinatorConfig
from runtime.protocol import (
    ANSWER_HEADER,
    CONTROL_KEY,
    NONCE_HEADER,
    DirectiveAnswer,
    SignatureError,
    answer_headers,
    derive_key,
    replica_key_id,
    sign,
    verify_answer,
)
from slurm.rundir import read_secret

KEY = derive_key(b"s" * 64, replica_key_id(1))
PATH = "/v1/replicas/1/directive?job=101&restarts=0&launch=0"
BODY = DirectiveAnswer("relaunch", 5.0, 0, 0).to_json()
GOOD = answer_headers(KEY, "GET", PATH, "ab" * 12, BODY)


@pytest.mark.parametrize(
    ("key", "path", "nonce", "body", "headers"),
    [
        (KEY, PATH, "cd" * 12, BODY, GOOD),  # another request's answer
        (KEY, PATH.replace("launch=0", "launch=1"), "ab" * 12, BODY, GOOD),
        (KEY, PATH, "ab" * 12, BODY.replace(b"relaunch", b"exit"), GOOD),
        (derive_key(b"s" * 64, replica_key_id(2)), PATH, "ab" * 12, BODY, GOOD),
        (KEY, PATH, "ab" * 12, BODY, {}),
        (KEY, PATH, "ab" * 12, BODY, {ANSWER_HEADER: "é" * 64}),
        (KEY, PATH, "ab" * 12, BODY, {ANSWER_HEADER: "0" * 63}),
    ],
    ids=["other-nonce", "other-path", "tampered", "other-key", "unsigned", "non-ascii", "short"],
)
def test_an_answer_verifies_only_for_its_own_request(
    key: bytes, path: str, nonce: str, body: bytes, headers: dict[str, str]
) -> None:
    verify_answer(KEY, "GET", PATH, "ab" * 12, BODY, GOOD)
    with pytest.raises(SignatureError):
        verify_answer(key, "GET", path, nonce, body, headers)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"directive": "exit"}', "restarts"),
        (b'{"directive": "relaunch", "delay_s": NaN, "restarts": 0, "launch": 0}', "NaN"),
        (b'{"directive": "relaunch", "delay_s": Infinity, "restarts": 0, "launch": 0}', "Inf"),
        (b'{"directive": "relaunch", "delay_s": -1, "restarts": 0, "launch": 0}', "delay_s"),
        (b'{"directive": "relaunch", "delay_s": 3601, "restarts": 0, "launch": 0}', "delay_s"),
        (b'{"directive": "relaunch", "delay_s": "5", "restarts": 0, "launch": 0}', "delay_s"),
        (b'{"directive": "shutdown", "restarts": 0, "launch": 0}', "directive"),
        (b'{"delay_s": 1, "restarts": 0, "launch": 0}', "directive"),
        (b'{"directive": "exit", "restarts": 0.0, "launch": 0}', "restarts"),
        (b'{"directive": "exit", "restarts": true, "launch": 0}', "restarts"),
        (b'{"directive": "exit", "restarts": 0, "launch": 1}', "epoch"),
        (b'{"directive": "exit", "restarts": 0, "launch": 0, "x": 1}', "unknown"),
        (b'["exit"]', "object"),
        (b"exit", "Expecting"),
    ],
)
def test_a_directive_out_of_range_is_refused(body: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        DirectiveAnswer.from_answer(body, restarts=0, launch=0)


def test_a_directive_in_range_is_taken() -> None:
    got = DirectiveAnswer.from_answer(BODY, restarts=0, launch=0)
    assert got == DirectiveAnswer("relaunch", 5.0, 0, 0)
    assert math.isfinite(got.delay_s)


async def _answers(run_dir: Path) -> dict[str, Any]:
    backend = RecordingBackend({"100": "node1", "101": "node2"})
    cfg = CoordinatorConfig(
        run_dir=run_dir, policy=PolicyConfig(replicas=2), job_ids={0: "100", 1: "101"},
        poll_jobs=False,
    )  # fmt: skip
    running = await start_coordinator(cfg, backend)
    secret = read_secret(run_dir / "secret")
    out: dict[str, Any] = {}
    try:
        async with aiohttp.ClientSession() as http:
            for name, key_id, path in (
                ("directive", replica_key_id(1), PATH),
                ("state", CONTROL_KEY, "/v1/state"),
            ):
                headers = sign(secret, key_id, "GET", path)
                async with http.get(running.url + path, headers=headers) as resp:
                    out[name] = (headers[NONCE_HEADER], await resp.read(), resp.headers)
            headers = sign(secret, replica_key_id(0), "GET", PATH)
            async with http.get(running.url + PATH, headers=headers) as resp:
                out["other replica's key"] = resp.status
    finally:
        await running.close()
    return out


@pytest.mark.timeout(60)
def test_the_coordinator_signs_its_answers_for_the_request(tmp_path: Path) -> None:
    got = asyncio.run(_answers(tmp_path))
    secret = read_secret(tmp_path / "secret")
    nonce, body, headers = got["directive"]
    key = derive_key(secret, replica_key_id(1))
    verify_answer(key, "GET", PATH, nonce, body, headers)
    assert DirectiveAnswer.from_answer(body, 0, 0).directive == "continue"
    with pytest.raises(SignatureError):  # the same answer replayed to another request
        verify_answer(key, "GET", PATH, "0" * 24, body, headers)
    nonce, body, headers = got["state"]
    verify_answer(derive_key(secret, CONTROL_KEY), "GET", "/v1/state", nonce, body, headers)
    assert got["other replica's key"] == 403
