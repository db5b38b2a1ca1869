"""What a failing broker needs of the clients (issue #13, broker faults), without a broker.

* Every record a durable producer writes is acknowledged or failed within ``ack_timeout_s``: its
  ``message.timeout.ms`` is set from it, a longer user setting is refused (librdkafka's default, 300 s,
  outlived the 60 s ack wait, so a record given up on could still land minutes later).
* librdkafka's log lines go to a Python logger, never to the terminal.
* A store whose record failed refuses to go on (a checkpoint must not complete over a lost record), and the
  journal delivers on close, then purges what is still unsent.
"""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from flink_agents_replay.core.errors import ConfigError, JournalError
from flink_agents_replay.integrations.kafka import JOURNAL, KafkaSettings
from flink_agents_replay.integrations.kafka.settings import LIBRDKAFKA_LOGGER
from flink_agents_replay.integrations.kafka.store import KafkaTopicStore, TopicDelivery

BOOTSTRAP = {"bootstrap.servers": "127.0.0.1:9092"}


def test_the_producer_times_deliveries_out_within_the_ack_wait():
    config = KafkaSettings.of(BOOTSTRAP).producer_config(durable=True, ack_timeout_s=60)
    assert config["message.timeout.ms"] == 60_000
    assert KafkaSettings.of(BOOTSTRAP).producer_config(durable=True, ack_timeout_s=2.5)["message.timeout.ms"] == 2500
    assert "message.timeout.ms" not in KafkaSettings.of(BOOTSTRAP).producer_config(durable=True)  # nothing waits


@pytest.mark.parametrize("name", ["message.timeout.ms", "delivery.timeout.ms"])
def test_a_shorter_user_delivery_timeout_is_kept(name):
    config = KafkaSettings.of({**BOOTSTRAP, name: 5000}).producer_config(durable=True, ack_timeout_s=60)
    assert config["message.timeout.ms"] == 5000


@pytest.mark.parametrize(("name", "value"), [("message.timeout.ms", 300_000), ("delivery.timeout.ms", "120000"),
                                             ("message.timeout.ms", 0)])
def test_a_delivery_timeout_longer_than_the_ack_wait_is_refused(name, value):
    settings = KafkaSettings.of({**BOOTSTRAP, name: value})
    expected = rf"journal topic waits 60 s \(ack_timeout_s\).*{name}={value}.*at most 60000"
    with pytest.raises(ConfigError, match=expected):
        settings.producer_config(durable=True, ack_timeout_s=60, what="journal topic")


def test_a_journal_store_refuses_a_too_long_delivery_timeout_before_contacting_kafka():
    from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore

    # Port 1: nothing listens; the config error must come first, naming the setting.
    with pytest.raises(ConfigError, match="message.timeout.ms"):
        KafkaJournalStore({"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 300_000}, "j", 4,
                          ack_timeout_s=60)


def test_every_client_logs_through_python_logging_unless_the_user_names_a_logger():
    settings = KafkaSettings.of(BOOTSTRAP)
    configs = [settings.admin_config(), settings.producer_config(durable=True, ack_timeout_s=5),
               settings.reader_config(purpose="recovery"), settings.producer_config(durable=False)]
    assert all(config["logger"] is LIBRDKAFKA_LOGGER for config in configs)
    own = logging.getLogger("my-kafka")
    assert KafkaSettings.of({**BOOTSTRAP, "logger": own}).admin_config()["logger"] is own


class _Error:
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def __str__(self):
        return f"error {self._code}"


@pytest.mark.parametrize(("code", "says"), [(KafkaError._MSG_TIMED_OUT, "within message.timeout.ms"),
                                            (KafkaError._PURGE_QUEUE, "dropped unsent: the store was closed"),
                                            (KafkaError.MSG_SIZE_TOO_LARGE, "Kafka rejected a record")])
def test_a_failed_delivery_says_why(code, says):
    delivery = TopicDelivery(JOURNAL)
    delivery._complete(_Error(code), None)
    with pytest.raises(JournalError, match=says):
        delivery.wait(1)


class _FakeProducer:
    """Stands in for confluent-kafka's Producer: keeps the callbacks, fails or acknowledges on demand."""

    def __init__(self, config):
        self.config = config
        self.callbacks = []
        self.purged = None
        self.flushed = []
        self.unsent = 0  # what a flush leaves undelivered (the broker is away)

    def produce(self, topic, value, key, partition, on_delivery):
        self.callbacks.append(on_delivery)

    def poll(self, timeout):
        return 0

    def flush(self, timeout):
        self.flushed.append(timeout)
        return self.unsent

    def purge(self, in_queue=True, in_flight=True, blocking=True):
        self.purged = (in_queue, in_flight)
        for callback in self.callbacks:
            callback(_Error(KafkaError._PURGE_QUEUE), None)


def _store(monkeypatch, purge: bool) -> KafkaTopicStore:
    import flink_agents_replay.integrations.kafka.store as store_module

    monkeypatch.setattr(store_module, "Producer", _FakeProducer)
    store = KafkaTopicStore.__new__(KafkaTopicStore)  # no broker: only the producer side is exercised
    store.role, store.topic, store.failed_delivery = JOURNAL, "j", None
    store._producer_config = KafkaSettings.of(BOOTSTRAP).producer_config(durable=True, ack_timeout_s=1)
    store._producer, store._poller = None, None
    import threading

    store._producer_lock, store._closing = threading.Lock(), threading.Event()
    store.purge_unsent_on_close = purge
    return store


def test_after_a_failed_delivery_the_store_refuses_appends_and_flushes(monkeypatch):
    store = _store(monkeypatch, purge=False)
    first = store.append(0, b"k", b"v")
    second = store.append(0, b"k", b"v")
    store._producer.callbacks[0](_Error(KafkaError._MSG_TIMED_OUT), None)
    store._producer.callbacks[1](None, type("M", (), {"offset": lambda self: 7})())
    assert second.wait(1) == 7
    with pytest.raises(JournalError, match="message.timeout.ms"):
        first.wait(1)
    with pytest.raises(JournalError, match="writes no further records"):
        store.flush(1)  # the producer's flush says 0 remaining: the failure must still be seen
    with pytest.raises(JournalError, match="writes no further records"):
        store.append(0, b"k", b"v")
    store.close()


def test_closing_the_journal_purges_what_it_could_not_deliver_and_reports_it(monkeypatch):
    store = _store(monkeypatch, purge=True)
    waiting = store.append(3, b"k", b"v")
    store._producer.unsent = 1
    store.close()
    assert store._producer.purged == (True, True)
    assert store._producer.flushed[0] == 5.0  # delivery was tried first, bounded
    with pytest.raises(JournalError, match="dropped unsent"):
        waiting.wait(0.1)  # reported at once: an abandoned writer is not left waiting ack_timeout_s


def test_closing_the_journal_purges_nothing_it_delivered(monkeypatch):
    store = _store(monkeypatch, purge=True)
    store.append(3, b"k", b"v")
    store.close()  # the fake's flush delivers everything
    assert store._producer.purged is None and store._producer.flushed == [5.0]


def test_other_stores_deliver_what_is_queued_on_close(monkeypatch):
    store = _store(monkeypatch, purge=False)
    store.append(0, b"k", b"v")
    store.close()
    assert store._producer.purged is None and store._producer.flushed


def test_the_journal_store_purges_on_close():
    from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore

    assert KafkaJournalStore.purge_unsent_on_close and not KafkaTopicStore.purge_unsent_on_close


_DEAD_BROKER_CLIENTS = r"""
import logging, sys
from confluent_kafka import Consumer, Producer
from flink_agents_replay.core.errors import JournalError
from flink_agents_replay.integrations.kafka import KafkaAdmin, KafkaSettings
from flink_agents_replay.integrations.kafka.settings import LIBRDKAFKA_LOGGER

lines = []
handler = logging.Handler()
handler.emit = lambda record: lines.append(record.getMessage())
LIBRDKAFKA_LOGGER.addHandler(handler)
LIBRDKAFKA_LOGGER.setLevel(logging.DEBUG)
settings = KafkaSettings.of({"bootstrap.servers": sys.argv[1]})
try:
    KafkaAdmin(settings, timeout_s=1.5).check_reachable()
except JournalError as exc:
    print("admin:", exc)
producer = Producer(settings.producer_config(durable=True, ack_timeout_s=1.5))
producer.produce("t", b"x")
producer.flush(3)
consumer = Consumer(settings.reader_config(purpose="recovery"))
consumer.subscribe(["t"])
consumer.poll(1.0)
consumer.close()
print("logged", len(lines))
"""


def test_clients_at_a_dead_broker_print_nothing_on_stderr_and_log_through_python_logging():
    import subprocess
    import sys

    from flink_agents_replay.local.processes import free_port

    # A subprocess, so that librdkafka's own writes to file descriptor 2 are caught (pytest's capture is not fd 2
    # of librdkafka's threads in every mode).
    result = subprocess.run([sys.executable, "-c", _DEAD_BROKER_CLIENTS, f"127.0.0.1:{free_port()}"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "could not reach Kafka" in result.stdout
    logged = int(result.stdout.rsplit("logged ", 1)[1])
    assert logged > 0  # the connection failures reached the logger...
    assert result.stderr == ""  # ...and nothing reached the terminal


_UNCONFIGURED_LOGGING = r"""
import sys
from confluent_kafka import Producer
from flink_agents_replay.integrations.kafka import KafkaSettings

producer = Producer(KafkaSettings.of({"bootstrap.servers": sys.argv[1]}).producer_config(durable=True,
                                                                                        ack_timeout_s=1.5))
producer.produce("t", b"x")
print("undelivered", producer.flush(2.5))
"""


def test_an_application_without_logging_set_up_sees_no_transient_connection_lines():
    """Python's last-resort handler prints WARNING and above of a logger nobody configured: librdkafka's retried
    connection failures (FAIL, GETPID) must not reach the terminal that way; they are logged at INFO."""
    import subprocess
    import sys

    from flink_agents_replay.local.processes import free_port

    result = subprocess.run([sys.executable, "-c", _UNCONFIGURED_LOGGING, f"127.0.0.1:{free_port()}"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "undelivered 0" in result.stdout, result.stderr  # timed out, reported
    assert result.stderr == ""


def test_transient_librdkafka_facilities_are_demoted_to_info_and_others_kept():
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    LIBRDKAFKA_LOGGER.addHandler(handler)
    try:
        LIBRDKAFKA_LOGGER.error("%s [%s] %s", "FAIL", "rdkafka#producer-1", "Connect to ipv4#127.0.0.1:1 failed")
        LIBRDKAFKA_LOGGER.warning("%s [%s] %s", "CONFWARN", "rdkafka#producer-1", "Configuration property ignored")
    finally:
        LIBRDKAFKA_LOGGER.removeHandler(handler)
    assert [(r.args[0], r.levelname) for r in records] == [("FAIL", "INFO"), ("CONFWARN", "WARNING")]


class _Offset:
    def __init__(self, offset):
        self.offset = offset


class _Future:
    def __init__(self, offset):
        self._offset = offset

    def result(self, timeout=None):
        return _Offset(self._offset)


class _OffsetsClient:
    """An admin client whose list_offsets answers the given offsets, one list per request (the last one repeats)."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.requests = 0

    def list_offsets(self, request, request_timeout=None):
        answer = self.answers[min(self.requests, len(self.answers) - 1)]
        self.requests += 1
        return {tp: _Future(answer[tp.partition]) for tp in request}

    def poll(self, timeout):
        return 0


def _admin_with(client, timeout_s=5.0):
    from flink_agents_replay.integrations.kafka import KafkaAdmin

    admin = KafkaAdmin(BOOTSTRAP, timeout_s=timeout_s)
    admin._client = client
    return admin


def test_an_offset_librdkafka_answers_as_minus_1001_is_asked_again_not_taken():
    # Seen on a real broker restart: list_offsets answered -1001 for every partition, without an error. A marker
    # built on it made every later restore fail with JournalGapError (the chaos soak's broker_restart).
    client = _OffsetsClient({0: -1001, 1: -1001}, {0: 7, 1: 3})
    assert _admin_with(client).end_offsets("j", [0, 1]) == {0: 7, 1: 3}
    assert client.requests == 2


def test_offsets_still_unknown_at_the_timeout_are_a_journal_error_naming_the_partitions():
    client = _OffsetsClient({0: 5, 1: -1001})
    with pytest.raises(JournalError, match=r"list offsets of .*'j'.*no offset for partitions \[1\]"):
        _admin_with(client, timeout_s=0.3).start_offsets("j", [0, 1])
    assert client.requests >= 2


def test_no_leaders_while_a_broker_restarts_is_retried():
    from confluent_kafka import KafkaException

    class NoLeadersOnce(_OffsetsClient):
        def list_offsets(self, request, request_timeout=None):
            if self.requests == 0:
                self.requests += 1
                raise KafkaException(KafkaError(KafkaError._NOENT, "Failed to query partition leaders: No leaders"))
            return super().list_offsets(request, request_timeout)

    assert _admin_with(NoLeadersOnce({0: 4})).end_offsets("j", [0]) == {0: 4}
