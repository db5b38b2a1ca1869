"""The local model service's embeddings: deterministic hashed bags of words, in OpenAI's format."""

from __future__ import annotations

import base64
import json
import math
import os
import struct
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from flink_agents_replay.local.embeddings import DIMENSIONS, embed
from flink_agents_replay.local.model_server import StubModelServer


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))  # unit vectors


def post(server: StubModelServer, body: dict, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(f"{server.base_url}/embeddings", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


@pytest.fixture
def server():
    with StubModelServer() as running:
        yield running


def test_texts_sharing_words_are_nearer_than_unrelated_ones():
    refund = embed("Customer asks for a refund of order 1234")
    also_refund = embed("refund request for order 1234, customer waiting")
    shipping = embed("parcel tracking shows delayed delivery")
    assert math.isclose(sum(x * x for x in refund), 1.0)
    assert cosine(refund, also_refund) > 0.5 > cosine(refund, shipping)
    assert embed("Refund, ORDER!") == embed("refund order")
    assert embed("...") == [0.0] * DIMENSIONS


def test_the_same_text_gets_the_same_vector_in_a_process_with_another_hash_seed():
    code = ("import json; from flink_agents_replay.local.embeddings import embed; "
            "print(json.dumps(embed('grüße 42 ok')))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert json.loads(other.stdout) == embed("grüße 42 ok")


def test_the_endpoint_answers_in_openai_format_and_counts(server):
    status, body = post(server, {"model": "embed-model", "input": ["refund please", "where is my parcel"],
                                 "dimensions": 64})
    assert status == 200 and body["object"] == "list" and body["model"] == "embed-model"
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert body["data"][0]["embedding"] == pytest.approx(embed("refund please", 64))
    status, body = post(server, {"input": "refund please", "encoding_format": "base64", "dimensions": 64})
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert list(struct.unpack("<64f", raw)) == pytest.approx(embed("refund please", 64), abs=1e-6)
    assert server.stats().embeddings == 2 and server.stats().chat == 0


def test_bad_embedding_requests_are_400_and_not_executed(server):
    for body in ({}, {"input": []}, {"input": [1]}, {"input": "x", "dimensions": 0},
                 {"input": "x", "dimensions": True}, {"input": "x", "encoding_format": "hex"}):
        status, answer = post(server, body)
        assert status == 400, body
        assert answer["error"]["type"] == "invalid_request_error"
    assert server.stats().embeddings == 0


def test_an_idempotency_key_is_executed_once(server):
    for _ in range(2):
        assert post(server, {"input": "x"}, {"Idempotency-Key": "k1"})[0] == 200
    assert server.stats().embeddings == 1 and server.stats().idempotent_replays == 1
