"""The user's Kafka settings, and the one place client configurations are derived from them.

Kafka settings follow confluent-kafka's idiom: one plain dict (``bootstrap.servers``, ``security.protocol``,
``sasl.*``, ``ssl.*``, timeouts...) that every client receives untouched. :class:`KafkaSettings` holds that
dict once, immutable, built from :class:`~flink_agents_replay.config.AgentConfig` (``config.kafka_settings()``)
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
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flink_agents_replay.errors import ConfigError

__all__ = ["COMMITTED_READER_SETTINGS", "DURABLE_PRODUCER_SETTINGS", "ORDERED_PRODUCER_SETTINGS", "KafkaSettings",
           "KafkaSettingsLike"]

#: What a producer whose records must arrive exactly once needs.
DURABLE_PRODUCER_SETTINGS: Mapping[str, Any] = {"enable.idempotence": True, "acks": "all"}
#: What a producer whose records must land in the order produced, even across retries, needs on top.
ORDERED_PRODUCER_SETTINGS: Mapping[str, Any] = {"max.in.flight.requests.per.connection": 1}
#: What a consumer that must see only committed records (none of an aborted or open transaction) needs.
COMMITTED_READER_SETTINGS: Mapping[str, Any] = {"isolation.level": "read_committed"}

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
        """Configuration of an admin client: the user's settings as given."""
        return self.client

    def producer_config(self, *, durable: bool, ordered: bool = False, what: str = "this producer") -> dict[str, Any]:
        """Configuration of a producer; ``durable`` adds :data:`DURABLE_PRODUCER_SETTINGS`, ``ordered``
        :data:`ORDERED_PRODUCER_SETTINGS` (one request in flight: slower, but a record's offset can be predicted).

        Raises :class:`ConfigError` (naming ``what`` needs it) when a user setting contradicts an added one.
        """
        config = self.client
        if durable:
            self.check_durable(what)
            config.update(DURABLE_PRODUCER_SETTINGS)
        if ordered:
            self._check_required(ORDERED_PRODUCER_SETTINGS, what)
            config.update(ORDERED_PRODUCER_SETTINGS)
        return config

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
        return {**self.client, "group.id": f"flink-agents-replay-{purpose}-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False, "auto.offset.reset": "error", **required}

    def get(self, name: str, default: Any = None) -> Any:
        """One setting's value (``default`` when the user gave none)."""
        return dict(self.pairs).get(name, default)

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
