"""A replay or ``diff`` reading a capture topic that holds malformed records gets a clear error, not a traceback."""

from __future__ import annotations

import json
import struct

import pytest

from flink_agents_replay.core.errors import SignatureError
from flink_agents_replay.storage.capture.reader import CaptureDecoder

KEY = b"k" * 32


def _envelope(header: bytes, body: bytes = b"", mac: bytes = b"\0" * 32) -> bytes:
    return struct.pack(">4sBI", b"FARJ", 3, len(header)) + header + body + mac


@pytest.mark.parametrize("value", [
    b"",
    b"hello",
    b"XXXX" + b"\0" * 60,  # bad magic
    _envelope(b"not json"),
    _envelope(b"[1, 2]"),  # JSON, but not an object
    _envelope(json.dumps({"kind": "input", "producer": "op"}).encode(), b"payload"),  # bad signature
], ids=["empty", "short", "bad-magic", "header-not-json", "header-not-object", "bad-signature"])
def test_a_malformed_capture_record_is_a_signature_error_naming_where_it_is(value):
    decoder = CaptureDecoder(KEY, "op")
    with pytest.raises(SignatureError, match="partition 0 offset 7"):
        decoder.decode(value, "partition 0 offset 7", topic="capture", partition=0)
