"""Capture: recording the traffic an agent saw, so a changed agent can be replayed against it.

What it records
---------------
With ``AgentConfig(capture=True)`` the agent's operator writes, to a capture topic of its own
(``<uid>.capture``, one partition per key group like the journal):

* every input it accepts, with the key, the seq it gave the input, its event time and the input itself,
  at the moment it accepts it (the operator is the one place that knows each key's accepted order);
* what every run produced: its output events and every call it made, with the result;
* every run parked at a wait (``ctx.wait_for`` with no decision yet): the wait and the calls so far. A run whose
  last record is a parked one was still waiting when the capture ended.

Unlike the journal, the capture is not pruned at checkpoints: it keeps what its retention says
(``capture_topic_config``, 7 days by default). At every checkpoint each subtask also writes a manifest
entry (``<capture topic>.manifest``, compacted): the checkpoint id and the capture offsets it stands at,
with the operator uid, key type, max parallelism and record format, and the production topics a replay
must never write to (journal, outputs named in ``output_topics``).

Steps
-----
1. Turn capture on in the production job: ``{"capture": True, "output_topics": ["replies"], ...}``.
2. Take savepoints as usual (``flink savepoint <job id>``, ``flink stop --savepointPath``): each one can
   start a replay (:mod:`flink_agents_replay.replay`).

Limits
------
* Records are signed with the job's signing key for their capture topic (a replay's capture record copied
  into production's is refused) and unpickled only after verification; they hold the inputs and call
  results in full, so protect the topic like the data it carries.
* Capture records travel asynchronously and are flushed at every checkpoint; one Kafka refused fails that
  checkpoint, before its manifest entry. After a failure the inputs since the last checkpoint are captured
  again when they are replayed (readers keep the last record of a key and seq).
* Capture adds one record per input and one per run to Kafka: size the topic's retention for the
  traffic you want to be able to replay.
"""

from flink_agents_replay.storage.capture.manifest import (
    CaptureDescription,
    CaptureStart,
    ManifestEntry,
    manifest_topic,
    read_capture_start,
)
from flink_agents_replay.storage.capture.reader import CaptureDecoder, read_capture
from flink_agents_replay.storage.capture.records import (
    BlockedCall,
    CapturedInput,
    CapturedOutput,
    CapturedParked,
    CapturedRun,
)

__all__ = ["BlockedCall", "CaptureDecoder", "CaptureDescription", "CapturedInput", "CapturedOutput", "CapturedParked",
           "CapturedRun", "CaptureStart", "ManifestEntry", "manifest_topic", "read_capture", "read_capture_start"]
