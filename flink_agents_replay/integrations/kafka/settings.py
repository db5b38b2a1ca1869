"""The user's Kafka settings, and the one place client configurations are derived from them.

Kafka settings follow confluent-kafka's idiom: one plain dict (``bootstrap.servers``, ``security.protocol``,
``sasl.*``, ``ssl.*``, timeouts...) that every client receives untouched. :class:`KafkaSettings` holds that
dict once, immutable, built from :class:`~flink_agents_replay.flink.config.AgentConfig` (``config.kafka_settings()``)
or from a plain mapping. Every admin client, producer and consumer of this package is configured through
it, so a setting the user gives reaches every connection the package opens, including the ones that create
topics.

Only what correctness needs is added: a *durable* producer (journal, capture, manifest) is idempotent with
``acks=all``, because a record that may be lost or duplicated would break reuse. An *ordered* producer
(one that checks the offset each record lands at, as loading a dumped topic does) also keeps one request in
flight per connection, so a retried batch can never land after a later one. A reading consumer gets a
throwaway group id and never commits; a *committed-only* reader (``isolation.level=read_committed``) sees
no record of an aborted or open transaction. A user setting that contradicts any of these is refused,
never silently overridden.

Two more things hold for every client, because a broker can fail underneath a running job:

* *A delivery fails in bounded time.* A producer whose records are waited for ``ack_timeout_s`` gets
  ``message.timeout.ms`` (alias ``delivery.timeout.ms``) no longer than that wait. librdkafka's default is
  300 s: a record the writer had given up on after 60 s could otherwise still land minutes later, behind
  the back of a failed and restored attempt. The user may set it shorter, never longer.
* *librdkafka logs through Python logging* (logger :data:`LIBRDKAFKA_LOGGER`, confluent-kafka's ``logger``
  setting), not onto the terminal: a broker that is down for a while makes librdkafka print a line per
  reconnect to stderr otherwise. Its reports of transient connection trouble, which it retries by itself,
  are demoted to INFO (an application without logging set up shows none of them). A user's own ``logger``
  setting is kept.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flink_agents_replay.core.errors import ConfigError

__all__ = ["COMMITTED_READER_SETTINGS", "DELIVERY_TIMEOUT_SETTINGS", "DURABLE_PRODUCER_SETTINGS", "LIBRDKAFKA_LOGGER",
           "ORDERED_PRODUCER_SETTINGS", "KafkaSettings", "KafkaSettingsLike"]

#: What a producer whose records must arrive exactly once needs.
DURABLE_PRODUCER_SETTINGS: Mapping[str, Any] = {"enable.idempotence": True, "acks": "all"}
#: What a producer whose records must land in the order produced, even across retries, needs on top.
ORDERED_PRODUCER_SETTINGS: Mapping[str, Any] = {"max.in.flight.requests.per.connection": 1}
#: What a consumer that must see only committed records (none of an aborted or open transaction) needs.
COMMITTED_READER_SETTINGS: Mapping[str, Any] = {"isolation.level": "read_committed"}
#: librdkafka's two names for how long a record may take from ``produce()`` to its acknowledgement.
DELIVERY_TIMEOUT_SETTINGS = ("message.timeout.ms", "delivery.timeout.ms")
#: Where librdkafka's own log lines go (every client of this package; level mapped from syslog by confluent-kafka).
LIBRDKAFKA_LOGGER = logging.getLogger("flink_agents_replay.kafka.librdkafka")
#: librdkafka facilities of transient connection trouble it retries by itself ("Connect to ... failed", "Failed
#: to acquire idempotence PID ... retrying"): logged at INFO. Whatever does not recover reaches the package as a
#: failed delivery or request within its timeout, and is reported there, in terms of the job.
TRANSIENT_FACILITIES = frozenset({"FAIL", "GETPID", "REQTMOUT", "DISCONNECT", "BROKERFAIL", "RETRY", "THROTTLE"})


class _TransientAtInfo(logging.Filter):
    """Demotes librdkafka's records of :data:`TRANSIENT_FACILITIES` to INFO (confluent-kafka logs
    ``"%s [%s] %s"`` with the facility first)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if (record.levelno > logging.INFO and isinstance(args, tuple) and args
                and args[0] in TRANSIENT_FACILITIES):
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


LIBRDKAFKA_LOGGER.addFilter(_TransientAtInfo())

# Names whose values are secrets: never shown by repr (settings end up in logs and tracebacks).
_SECRET_MARKERS = ("password", "secret", "sasl.jaas.config", "ssl.key.pem", "oauthbearer.config")


@dataclass(frozen=True)
class KafkaSettings:
    """Bootstrap servers plus the user's other client settings, immutable.

    Build with :meth:`of` (from a mapping, a bootstrap string or another ``KafkaSettings``). The settings
    are kept as sorted ``(name, value)`` pairs, so the object cannot change and pickles plainly (Flink ships
    operators to its workers pickled).
    """

    pairs: tuple[tuple[str, Any], ...]

    def __post_init__(self) -> None:
        if not dict(self.pairs).get("bootstrap.servers"):
            raise ConfigError("the Kafka settings need 'bootstrap.servers' (e.g. {'bootstrap.servers': 'host:9092'})")

    @classmethod
    def of(cls, settings: KafkaSettingsLike) -> KafkaSettings:
        """``settings`` as :class:`KafkaSettings`: a confluent-kafka settings mapping, or a bare bootstrap string."""
        if isinstance(settings, KafkaSettings):
            return settings
        if isinstance(settings, str):
            return cls((("bootstrap.servers", settings),))
        if not isinstance(settings, Mapping):
            raise ConfigError(f"Kafka settings must be a mapping of confluent-kafka settings or a bootstrap "
                              f"servers string, got {type(settings).__name__}")
        return cls(tuple(sorted((str(name), value) for name, value in settings.items())))

    @property
    def bootstrap_servers(self) -> str:
        """The ``bootstrap.servers`` setting."""
        return str(dict(self.pairs)["bootstrap.servers"])

    @property
    def client(self) -> dict[str, Any]:
        """The user's settings as given (a fresh dict each time)."""
        return dict(self.pairs)

    def admin_config(self) -> dict[str, Any]:
        """Configuration of an admin client: the user's settings, logging through :data:`LIBRDKAFKA_LOGGER`."""
        return self._logged(self.client)

    def producer_config(self, *, durable: bool, ordered: bool = False, what: str = "this producer",
                        ack_timeout_s: float | None = None) -> dict[str, Any]:
        """Configuration of a producer; ``durable`` adds :data:`DURABLE_PRODUCER_SETTINGS`, ``ordered``
        :data:`ORDERED_PRODUCER_SETTINGS` (one request in flight: slower, but a record's offset can be predicted).
        With ``ack_timeout_s`` (how long its deliveries are waited for), ``message.timeout.ms`` is that wait
        unless the user set it shorter: a record then either lands or fails before the wait ends.

        Raises :class:`ConfigError` (naming ``what`` needs it) when a user setting contradicts an added one.
        """
        config = self.client
        if durable:
            self.check_durable(what)
            config.update(DURABLE_PRODUCER_SETTINGS)
        if ordered:
            self._check_required(ORDERED_PRODUCER_SETTINGS, what)
            config.update(ORDERED_PRODUCER_SETTINGS)
        if ack_timeout_s is not None:
            config.update(self.delivery_timeout(ack_timeout_s, what))
        return self._logged(config)

    def delivery_timeout(self, ack_timeout_s: float, what: str = "this producer") -> dict[str, int]:
        """``{"message.timeout.ms": ...}`` for a producer whose deliveries are waited for ``ack_timeout_s``.

        The user's ``message.timeout.ms`` / ``delivery.timeout.ms`` is kept when it is no longer than the wait;
        a longer one is refused (:class:`ConfigError`): a record could land after the writer gave up on it.
        """
        limit_ms = max(1, int(ack_timeout_s * 1000))
        given = {name: self.get(name) for name in DELIVERY_TIMEOUT_SETTINGS if self.get(name) is not None}
        for name, value in given.items():
            try:
                given_ms = int(value)
            except (TypeError, ValueError):
                raise ConfigError(f"Kafka setting {name}={value!r} must be a whole number of milliseconds") from None
            if given_ms <= 0 or given_ms > limit_ms:
                raise ConfigError(
                    f"the {what} waits {ack_timeout_s:g} s (ack_timeout_s) for Kafka to acknowledge a record, but "
                    f"Kafka setting {name}={value} lets a record be delivered later than that (or never time out): set "
                    f"{name} to at most {limit_ms}, or remove it (it then defaults to ack_timeout_s), or raise "
                    "ack_timeout_s")
            limit_ms = given_ms
        return {"message.timeout.ms": limit_ms}

    def check_durable(self, what: str) -> None:
        """Refuse settings that contradict an idempotent producer with ``acks=all`` (``what`` needs it)."""
        self._check_required(DURABLE_PRODUCER_SETTINGS, what)

    def reader_config(self, *, purpose: str, committed_only: bool = False) -> dict[str, Any]:
        """Configuration of a consumer that reads assigned partitions between offsets: a throwaway group id
        (``assign()`` only, never committed), and no silent skip past a gap (``auto.offset.reset=error``).

        ``committed_only`` adds :data:`COMMITTED_READER_SETTINGS` (refusing a user's ``read_uncommitted``): the
        reader then stops before an open transaction and sees an aborted one as a gap in the offsets.
        """
        if committed_only:
            self._check_required(COMMITTED_READER_SETTINGS, f"{purpose} reader")
        required = COMMITTED_READER_SETTINGS if committed_only else {}
        return self._logged({**self.client, "group.id": f"flink-agents-replay-{purpose}-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False, "auto.offset.reset": "error", **required})

    def get(self, name: str, default: Any = None) -> Any:
        """One setting's value (``default`` when the user gave none)."""
        return dict(self.pairs).get(name, default)

    @staticmethod
    def _logged(config: dict[str, Any]) -> dict[str, Any]:
        """``config`` with librdkafka's log lines going to :data:`LIBRDKAFKA_LOGGER` (unless it names a logger)."""
        config.setdefault("logger", LIBRDKAFKA_LOGGER)
        return config

    def _check_required(self, required: Mapping[str, Any], what: str) -> None:
        """Refuse a user setting that contradicts one of ``required`` (``what`` needs them)."""
        config = self.client
        for name, value in required.items():
            if name in config and str(config[name]).lower() != str(value).lower():
                raise ConfigError(f"the {what} needs Kafka setting {name}={value}; remove {name} from the config")

    def __repr__(self) -> str:
        shown = {name: "***" if is_secret_setting(name) else value for name, value in self.pairs}
        return f"KafkaSettings({shown})"


def is_secret_setting(name: str) -> bool:
    """Whether a Kafka client setting holds a secret (never shown in a repr, log line or message)."""
    return any(marker in name.lower() for marker in _SECRET_MARKERS)


#: What functions taking Kafka settings accept.
KafkaSettingsLike = KafkaSettings | Mapping[str, Any] | str
