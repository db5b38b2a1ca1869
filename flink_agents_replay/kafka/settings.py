"""The user's Kafka settings, and the one place client configurations are derived from them.

Kafka settings follow confluent-kafka's idiom: one plain dict (``bootstrap.servers``, ``security.protocol``,
``sasl.*``, ``ssl.*``, timeouts...) that every client receives untouched. :class:`KafkaSettings` holds that
dict once, immutable, built from :class:`~flink_agents_replay.config.AgentConfig` (``config.kafka_settings()``)
or from a plain mapping. Every admin client, producer and consumer of this package is configured through
it, so a setting the user gives reaches every connection the package opens, including the ones that create
topics.

Only what correctness needs is added: a *durable* producer (journal, capture, manifest) is idempotent with
``acks=all``, because a record that may be lost or duplicated would break reuse. A user setting that
contradicts those two is refused, never silently overridden. A reading consumer gets a throwaway group id
and never commits.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flink_agents_replay.errors import ConfigError

__all__ = ["DURABLE_PRODUCER_SETTINGS", "KafkaSettings", "KafkaSettingsLike"]

#: What a producer whose records must arrive exactly once needs.
DURABLE_PRODUCER_SETTINGS: Mapping[str, Any] = {"enable.idempotence": True, "acks": "all"}

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

    def producer_config(self, *, durable: bool, what: str = "this producer") -> dict[str, Any]:
        """Configuration of a producer; ``durable`` adds :data:`DURABLE_PRODUCER_SETTINGS`.

        Raises :class:`ConfigError` (naming ``what`` needs it) when a user setting contradicts a durable one.
        """
        config = self.client
        if durable:
            self.check_durable(what)
            config.update(DURABLE_PRODUCER_SETTINGS)
        return config

    def check_durable(self, what: str) -> None:
        """Refuse settings that contradict an idempotent producer with ``acks=all`` (``what`` needs it)."""
        config = self.client
        for name, required in DURABLE_PRODUCER_SETTINGS.items():
            if name in config and str(config[name]).lower() != str(required).lower():
                raise ConfigError(f"the {what} needs Kafka setting {name}={required}; remove {name} from the config")

    def reader_config(self, *, purpose: str) -> dict[str, Any]:
        """Configuration of a consumer that reads assigned partitions between offsets: a throwaway group id
        (``assign()`` only, never committed), and no silent skip past a gap (``auto.offset.reset=error``)."""
        return {**self.client, "group.id": f"flink-agents-replay-{purpose}-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False, "auto.offset.reset": "error"}

    def get(self, name: str, default: Any = None) -> Any:
        """One setting's value (``default`` when the user gave none)."""
        return dict(self.pairs).get(name, default)

    def __repr__(self) -> str:
        shown = {name: "***" if any(marker in name.lower() for marker in _SECRET_MARKERS) else value
                 for name, value in self.pairs}
        return f"KafkaSettings({shown})"


#: What functions taking Kafka settings accept.
KafkaSettingsLike = KafkaSettings | Mapping[str, Any] | str
