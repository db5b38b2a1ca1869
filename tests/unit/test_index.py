"""The recovery index: accepted order, and a later history superseding an abandoned one."""

from flink_agents_replay.storage.journal.index import RecoveryIndex
from flink_agents_replay.storage.records.journal import AcceptedRecord, CallOutcome, CallRecord, CompletionRecord


def completion(seq: int, digest: str, action: str = "a") -> CompletionRecord:
    return CompletionRecord(seq, 0, f"e{seq}", action, "fp", input_digest=digest)


def call(seq: int, digest: str) -> CallRecord:
    return CallRecord(seq, 0, f"e{seq}", "a", 0, "tool", "args", CallOutcome.RETURNED, "r", digest)


def test_accepted_records_give_the_recorded_order_even_without_other_records():
    index = RecoveryIndex()
    for seq, digest in ((4, "d4"), (5, "d5"), (6, "d6")):
        index.add("k", 0, seq, AcceptedRecord(seq, digest))
    index.add("k", 0, 10, completion(4, "d4"))
    history = index.history("k")
    assert [history.recorded_input(s) for s in (4, 5, 6, 7)] == ["d4", "d5", "d6", None]
    assert max(history.input_digests) == 6 and len(history) == 4
    history.drop_through_seq(5)
    assert max(history.input_digests) == 6 and history.recorded_input(5) is None and len(history) == 1


def test_a_later_record_for_a_seq_with_another_input_supersedes_the_history_from_that_seq():
    """After a restore ran another input at seq 5 (divergence or order-restore timeout), a second restore
    must see that newer history, not the abandoned one (read in write order)."""
    index = RecoveryIndex()
    first_attempt = [AcceptedRecord(5, "old5"), call(5, "old5"), completion(5, "old5"),
                     AcceptedRecord(6, "old6"), completion(6, "old6")]
    second_attempt = [AcceptedRecord(5, "new5"), call(5, "new5"), completion(5, "new5")]
    for offset, record in enumerate(first_attempt + second_attempt):
        index.add("k", 0, offset, record)
    history = index.history("k")
    assert history.recorded_input(5) == "new5"
    assert history.recorded_input(6) is None, "the abandoned history after seq 5 must be gone"
    assert history.completion(5, "e5", "a").input_digest == "new5"
    assert history.input_matches(5, "new5") and not history.input_matches(5, "old5")
    assert len(history) == 3
