"""One typed configuration object for an agent's operator, validated up front with clear errors.

Kafka settings follow confluent-kafka's idiom: a plain dict passed through to every client untouched
(``bootstrap.servers``, ``security.protocol``, ``sasl.*``, ``ssl.*``...).

    config = AgentConfig(kafka={"bootstrap.servers": "kafka:9092"}, max_concurrent_runs=16)

A setting of the wrong type would fail deep inside a running job (``'<' not supported between instances of 'str'
and 'int'``), or worse, quietly mean something else (``output_topics="replies"`` is seven one-letter topics).
:meth:`AgentConfig.resolved` checks every setting's type and limits with pydantic (:class:`_TypedSettings`) and
raises a :class:`ConfigError` that names the first wrong one, what it must be and what it is. NumPy scalars that
say the same as a Python value are taken as that value, so what the package keeps and logs is plain Python.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Annotated, Any, Literal

import pydantic
from pydantic import AfterValidator, BeforeValidator, Field, Strict

from flink_agents_replay.core.errors import ConfigError, ReplayIsolationError
from flink_agents_replay.engine import FingerprintPolicy
from flink_agents_replay.integrations.kafka.settings import KafkaSettings, is_secret_setting
from flink_agents_replay.replay.settings import ReplaySettings
from flink_agents_replay.storage.journal.writer import Durability
from flink_agents_replay.traces.export import TracingConfig

__all__ = ["SIGNING_KEY_ENV", "AgentConfig", "default_capture_topic", "default_journal_topic", "default_uid",
           "job_signing_key", "read_signing_key_file"]

#: Environment variable holding the journal signing key when the config does not.
SIGNING_KEY_ENV = "FLINK_AGENTS_REPLAY_SIGNING_KEY"


def default_uid(agent_name: str) -> str:
    """The operator uid of an agent whose config names none."""
    return f"flink-agents-replay/{agent_name}"


def default_journal_topic(uid: str) -> str:
    """The journal topic of an operator whose config names none."""
    return f"{uid.replace('/', '.')}.journal"


def default_capture_topic(uid: str) -> str:
    """The capture topic of an operator whose config names none."""
    return f"{uid.replace('/', '.')}.capture"


#: Retention of a created capture topic unless ``capture_topic_config`` says otherwise: 7 days.
DEFAULT_CAPTURE_RETENTION_MS = 7 * 24 * 3600 * 1000


@dataclass(frozen=True)
class AgentConfig:
    """Settings of one agent operator.

    Attributes:
        kafka: confluent-kafka settings for the journal, passed through (needs ``bootstrap.servers``).
        journal_topic: the journal topic (default ``<uid>.journal`` with '/' replaced by '.').
        signing_key: HMAC key for journal records (default ``$FLINK_AGENTS_REPLAY_SIGNING_KEY``); at least
            16 characters, the same for every run that must reuse the journal.
        verification_keys: older signing keys whose journal and capture records are still accepted, after a
            key rotation (``flink_agents_replay.storage.records.codec`` lists the steps); each at least 16 characters.
        uid: the operator's uid (default ``flink-agents-replay/<agent name>``). Changing it breaks restores.
        max_parallelism: key groups and journal partitions; pinned, because changing it breaks restores.
        max_concurrent_runs: keys whose runs execute at once per subtask.
        max_concurrent_child_calls: threads per subtask running sub-agent calls of ``ctx.call_agents``
            besides the calling actions themselves (a separate pool: children never wait for run slots).
        durability: when the outputs of a run may leave (:mod:`flink_agents_replay.storage.journal.writer`): ``per_run``
            (default: once its records are acknowledged; any sink), ``at_checkpoint`` (at once, the checkpoint
            flushes; for an exactly-once sink), or ``per_action`` / ``per_call`` (also waiting at every action or
            call: fewer calls made again after a crash, slower). ``per_bundle`` is an old name of ``per_run``.
        journal_enabled: ``False`` runs without a journal (nothing is reused after a failure).
        fingerprint_policy: reuse of records written by other action code (``reuse``, ``re-execute``, ``fail``);
            default ``reuse``, and ``re-execute`` in a replay (the point of a replay is to run the new code).
        continue_job: the id of an earlier job this one continues when it starts without a checkpoint: the
            records that job journaled since its first attempt are reused (a job that used up its restarts
            before its first checkpoint, submitted again under a new job id). By default a new job reuses
            nothing of earlier jobs.
        accept_reexecution_after_gap: restore even when records the checkpoint needs were deleted
            (restoring an older savepoint after later pruning); the affected actions run again.
        accept_moved_journal_from: the topic id (or ids) of a journal topic this job's checkpoints were taken
            against, before the journal was moved to the current topic with ``flink-agents-replay journal
            dump``/``load`` (which keeps offsets and prints the old id): a restore accepts such a checkpoint
            when every owned partition reaches the checkpoint's end offsets. Default: a different topic id is
            refused (a deleted and recreated journal).
        slot_wait_timeout_s: how long the operator may hold its input with no run ending (every run slot busy,
            or ``max_waiting_inputs`` waiting) before the task fails: a call probably hangs.
        close_timeout_s: how long closing the operator (cancel, failover) waits for calls under way; runs still
            calling then are abandoned, counted (``runs_abandoned``) and their calls are in doubt. Keep it well
            below Flink's ``task.cancellation.timeout`` (180 s), past which Flink kills the TaskManager.
        ack_timeout_s: how long a journal write may wait for Kafka's acknowledgement.
        kafka_timeout_s: bound on start-up and restore requests to Kafka.
        create_topic: create the journal topic and its fence topic (``<journal>.fences``, one partition) if missing.
        replication_factor: replication of a created journal topic and fence topic (default: the broker's).
        topic_config: topic settings of a created journal topic.
        wake_on_completion: a run that can be applied wakes its key on the task thread (through the checkpoint
            bridge's mailbox); ``False`` makes every key with a run in flight poll for it instead.
        poll_interval_ms: with ``wake_on_completion=False``, how often a key with a run in flight checks whether
            it finished.
        max_waiting_inputs: how many inputs may wait, per subtask, behind their keys' runs under way before the
            operator takes no more input (backpressure to the source; default ``4 * max_concurrent_runs``). With
            ``wake_on_completion=False`` input is never held: nothing would end a hold but the polling timers.
        fallback_check_ms: with ``wake_on_completion``, how often a key with a run in flight checks anyway (a
            safety net: a wake-up lost to a full pipe is applied by this check).
        restore_input_order: after a restore, run each key's inputs in the order the journal recorded
            them, holding back inputs that arrive before their recorded predecessors (several upstream
            instances per key, docs/design.md §8); ``False`` runs them in arrival order.
        order_restore_timeout_s: how long a key waits for a recorded input that does not come back; then
            its recorded history from there is invalidated and its waiting inputs run in arrival order.
        recovered_history_expiry_s: how long, after a restore, a key's recovered journal history waits for
            its recorded inputs to come back (a key none of whose inputs comes back: a non-replayable source, a
            changed filter, a processing-time window upstream). Then it expires: counted
            (``histories_expired``), logged, and its records no longer hold pruning back; such an input that
            still comes back later runs again. The wait counts across further restores. Default 30 minutes.
        early_decision_ttl_s: how long a decision for no wait of its key is kept (one read again after a
            failover comes before its run re-opens the wait), and how long a finished wait's decision is kept
            to recognise a duplicate. Default one hour.
        max_early_decisions_per_key: how many decisions for waits it has not reached yet a key keeps; one more
            is refused (reported as a ``decision_rejected`` event).
        later_inputs_while_waiting: what a key's later inputs do while one of its runs waits at
            ``ctx.wait_for``: ``"hold"`` (default) waits for the decision, in order; ``"run"`` runs them meanwhile.
            The resumed run then sees the memory as it was when it started (with its own writes), and when it
            finishes, the memory paths it wrote are written over the key's memory as it is then (README,
            *Waiting for people*). Applies to runs that park from then on.
        capture: record every accepted input and every run's outputs and calls to the capture topic, and
            a manifest entry per checkpoint (the traffic a replay runs again; docs/design.md §9).
        capture_topic: the capture topic (default ``<uid>.capture`` with '/' replaced by '.'); its
            manifest is ``<capture_topic>.manifest``.
        capture_topic_config: topic settings of a created capture topic (default retention 7 days; the
            capture is never pruned at checkpoints).
        output_topics: the topics the job writes the agent's outputs to; recorded in the capture manifest
            so that a replay refuses to write to them.
        replay: replay mode (set by the replay job, :mod:`flink_agents_replay.replay`).
        tracing: send OpenTelemetry spans of every run, action and call (docs/design.md §17): ``True`` for the
            defaults (OTLP/HTTP to ``$OTEL_EXPORTER_OTLP_ENDPOINT``), a :class:`TracingConfig` (or a dict of its
            settings) to choose; ``None``/``False``: off.
    """

    kafka: Mapping[str, Any] = field(default_factory=dict)
    journal_topic: str | None = None
    signing_key: str | bytes | None = None
    verification_keys: Sequence[str | bytes] = field(default=(), repr=False)
    uid: str | None = None
    max_parallelism: int = 128
    max_concurrent_runs: int = 8
    max_concurrent_child_calls: int = 8
    durability: Durability = Durability.PER_RUN
    journal_enabled: bool = True
    fingerprint_policy: FingerprintPolicy | None = None
    accept_reexecution_after_gap: bool = False
    accept_moved_journal_from: str | Sequence[str] | None = None
    continue_job: str | None = None
    slot_wait_timeout_s: float = 600.0
    close_timeout_s: float = 30.0
    ack_timeout_s: float = 60.0
    kafka_timeout_s: float = 30.0
    create_topic: bool = True
    replication_factor: int | None = None
    topic_config: Mapping[str, str] = field(default_factory=dict)
    wake_on_completion: bool = True
    poll_interval_ms: int = 5
    fallback_check_ms: int = 1000
    max_waiting_inputs: int | None = None
    restore_input_order: bool = True
    order_restore_timeout_s: float = 30.0
    recovered_history_expiry_s: float = 1800.0
    early_decision_ttl_s: float = 3600.0
    max_early_decisions_per_key: int = 16
    later_inputs_while_waiting: Literal["hold", "run"] = "hold"
    capture: bool = False
    capture_topic: str | None = None
    capture_topic_config: Mapping[str, str] = field(default_factory=dict)
    output_topics: Sequence[str] = ()
    replay: ReplaySettings | None = None
    tracing: TracingConfig | bool | None = None

    def __repr__(self) -> str:
        # Configs end up in logs and tracebacks: the signing key and Kafka secrets are never shown.
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "signing_key" and value is not None:
                value = "***"
            elif f.name == "verification_keys":
                value = ["***" for _ in value]
            elif f.name == "kafka":
                value = {name: "***" if is_secret_setting(name) else v for name, v in dict(value).items()}
            shown.append(f"{f.name}={value!r}")
        return f"AgentConfig({', '.join(shown)})"

    __str__ = __repr__

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any]) -> AgentConfig:
        """Build from a plain dict; unknown names are an error that lists the known ones."""
        if isinstance(settings, AgentConfig):
            return settings
        if not isinstance(settings, Mapping):
            raise ConfigError(f"the agent config must be an AgentConfig or a dict of its settings, got "
                              f"{type(settings).__name__}: {settings!r:.100}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ConfigError(f"unknown agent config setting(s) {unknown}; known settings: {sorted(known)}")
        return cls(**dict(settings))

    def resolved(self, agent_name: str) -> AgentConfig:
        """A validated copy with defaults filled in (uid, topic, enum values, signing key)."""
        return replace(self, **_checked_settings(self))._resolved(agent_name)  # typed settings, as plain values

    def _resolved(self, agent_name: str) -> AgentConfig:
        durability, policy = self._enums()
        uid = self.uid or default_uid(agent_name)
        topic = self.journal_topic or default_journal_topic(uid)
        signing_key = self.signing_key if self.signing_key is not None else os.environ.get(SIGNING_KEY_ENV)
        if self.journal_enabled:
            self._check_journal_needs(signing_key)
        capture_topic = self.capture_topic or default_capture_topic(uid)
        if self.replay is not None:
            _check_isolation(self.replay, topic, capture_topic if self.capture else None, self.output_topics)
        return replace(self, uid=uid, journal_topic=topic, signing_key=signing_key, durability=durability,
                       tracing=_tracing(self.tracing),
                       fingerprint_policy=policy, kafka=dict(self.kafka), topic_config=dict(self.topic_config),
                       capture_topic=capture_topic, output_topics=tuple(self.output_topics),
                       capture_topic_config={"retention.ms": str(DEFAULT_CAPTURE_RETENTION_MS),
                                             **self.capture_topic_config})

    def _enums(self) -> tuple[Durability, FingerprintPolicy]:
        try:
            durability = Durability(self.durability)
        except ValueError:
            raise ConfigError(f"durability must be one of {[d.value for d in Durability]}, "
                              f"got {self.durability!r}") from None
        try:
            default_policy = FingerprintPolicy.RE_EXECUTE if self.replay is not None else FingerprintPolicy.REUSE
            return durability, FingerprintPolicy(self.fingerprint_policy or default_policy)
        except ValueError:
            raise ConfigError(f"fingerprint_policy must be one of {[p.value for p in FingerprintPolicy]}, "
                              f"got {self.fingerprint_policy!r}") from None

    @property
    def waiting_inputs_bound(self) -> int:
        """``max_waiting_inputs``, or its default, ``4 * max_concurrent_runs``."""
        return 4 * self.max_concurrent_runs if self.max_waiting_inputs is None else self.max_waiting_inputs

    def _check_journal_needs(self, signing_key: str | bytes | None) -> None:
        if not self.kafka.get("bootstrap.servers"):
            raise ConfigError("the journal needs Kafka: AgentConfig(kafka={'bootstrap.servers': 'host:9092'}) "
                              "(or journal_enabled=False to run without reuse after failures)")
        if not signing_key or len(signing_key) < 16:
            raise ConfigError(
                f"the journal needs a signing key of at least 16 characters: set {SIGNING_KEY_ENV} or "
                "AgentConfig(signing_key=...); keep it secret and the same across restarts"
            )
        if isinstance(self.verification_keys, (str, bytes)) or any(len(k) < 16 for k in self.verification_keys):
            raise ConfigError("verification_keys must be a list of keys of at least 16 characters each")

    def kafka_settings(self) -> KafkaSettings:
        """The ``kafka`` settings as the one object every Kafka client of the operator is built from."""
        return KafkaSettings.of(self.kafka)

    @property
    def signing_key_bytes(self) -> bytes:
        """The signing key as bytes."""
        key = self.signing_key or b""
        return key.encode() if isinstance(key, str) else key

    @property
    def verification_keys_bytes(self) -> tuple[bytes, ...]:
        """The older keys still accepted, as bytes."""
        return tuple(k.encode() if isinstance(k, str) else k for k in self.verification_keys)


def _tracing(setting: Any) -> TracingConfig | None:
    """``tracing`` as the operator uses it: a :class:`TracingConfig`, or ``None`` for off."""
    if setting is None or setting is False:
        return None
    _check_tracing_installed()
    if setting is True:
        return TracingConfig()
    if isinstance(setting, TracingConfig):
        return setting
    if isinstance(setting, Mapping):
        try:
            return TracingConfig(**dict(setting))
        except pydantic.ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            where = ".".join(str(part) for part in error["loc"])
            shown = "" if where.startswith("headers") else f" (got {error.get('input')!r:.80})"  # may hold a token
            raise ConfigError(f"tracing setting {where!r}: {error['msg']}{shown}") from None
    raise ConfigError(f"tracing must be True, False, None, a TracingConfig or a dict of its settings, got "
                      f"{type(setting).__name__}: {setting!r:.80}")


def _check_tracing_installed() -> None:
    """Tracing exports with the OpenTelemetry SDK's OTLP/HTTP exporter, an optional extra: said where the job is
    built, not found missing in a TaskManager's exporter process."""
    import importlib.util

    try:
        found = importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is not None
    except ModuleNotFoundError:  # a parent package is missing
        found = False
    if not found:
        raise ConfigError("tracing needs the OpenTelemetry SDK and its OTLP exporter: "
                          "pip install 'flink-agents-replay[tracing]'")


def read_signing_key_file(path: str) -> str:
    """The signing key kept in a file (its first line, surrounding whitespace removed): how a job takes the key
    without it showing on a command line (``ps``). Errors name the file, never its content."""
    try:
        with open(path, encoding="utf-8") as key_file:
            key = key_file.readline().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the signing key file {path!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"the signing key file {path!r} is not UTF-8 text") from None
    if len(key) < 16:
        raise ConfigError(f"the signing key file {path!r} holds no key of at least 16 characters on its first line")
    return key


def job_signing_key(*, key_file: str | None, key: str | None) -> str | None:
    """A job script's signing key: from ``--signing-key-file``, else ``--signing-key`` (with a warning: a
    command line is visible to every user of the machine through ``ps``), else ``$FLINK_AGENTS_REPLAY_SIGNING_KEY``."""
    if key_file:
        return read_signing_key_file(key_file)
    if key:
        warnings.warn("--signing-key puts the journal signing key on the command line, where `ps` shows it to every "
                      f"user of the machine: use --signing-key-file or ${SIGNING_KEY_ENV} instead", stacklevel=2)
        return key
    return os.environ.get(SIGNING_KEY_ENV)


def _check_isolation(replay: ReplaySettings, journal_topic: str, capture_topic: str | None,
                     output_topics: Sequence[str]) -> None:
    """A replay writes only to its own topics: refuse any production topic as a target."""
    targets = {"journal topic": journal_topic, "capture topic": capture_topic,
               **{f"output topic {t!r}": t for t in output_topics}}
    protected = {*replay.production_topics, replay.production_capture_topic, replay.production_journal_topic}
    for role, target in targets.items():
        if target is not None and target in protected:
            raise ReplayIsolationError(
                f"the replay's {role} is {target!r}, a production topic: a replay writes its journal, capture and "
                "outputs to topics of its own (e.g. with a '.replay-<name>' suffix)")


def _plain(value: Any) -> Any:
    """A NumPy scalar as the Python value it says (``np.int64(4)`` is 4); anything else as it is."""
    return value.item() if type(value).__module__ == "numpy" and hasattr(value, "item") else value


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("not finite")  # reported as not a number of seconds, before any limit
    return value


#: The longest Kafka timeout and the longest interval: Kafka's clients take milliseconds as a 32-bit integer
#: (about 24.8 days), and a check interval longer than that is of no use.
_MAX_MS = 2**31 - 1
#: The longest other timeout: Python's waits refuse longer ones (``threading.TIMEOUT_MAX`` is larger).
_MAX_WAIT_S = 10**9


def _not_nan(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        raise ValueError("not a number")
    return value


_Plain = BeforeValidator(_plain)
_Text = Annotated[str, Strict()]
_Whole = Annotated[int, _Plain, Strict()]
_Seconds = Annotated[float, BeforeValidator(_finite), _Plain, Strict()]
_Duration = Annotated[float, BeforeValidator(_not_nan), _Plain, Strict()]  # inf: never
_Key = Annotated[str, Strict()] | Annotated[bytes, Strict()] | bytearray
_Flag = Annotated[bool, _Plain, Strict()]
_Texts = Annotated[Sequence[_Text], AfterValidator(tuple)]  # a list or tuple, not a set (its order varies)
_Settings = Mapping[Any, Any]  # any mapping, kept as a dict
_AtLeastOne = Field(ge=1, description="a whole number")
_Interval = Field(ge=1, le=_MAX_MS, description="a whole number of milliseconds")
_KafkaTimeout = Field(gt=0, le=_MAX_MS // 1000, description="a finite number of seconds")
_Timeout = Field(gt=0, le=_MAX_WAIT_S, description="a finite number of seconds")


class _TypedSettings(pydantic.BaseModel):
    """The type and limits of each typed setting of :class:`AgentConfig`; ``description`` says what it must be."""

    model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)

    max_parallelism: _Whole = Field(ge=1, le=32768, description="a whole number")
    max_concurrent_runs: _Whole = _AtLeastOne
    max_concurrent_child_calls: _Whole = _AtLeastOne
    poll_interval_ms: _Whole = _Interval
    fallback_check_ms: _Whole = _Interval
    max_waiting_inputs: _Whole | None = Field(ge=1, description="a whole number or None")
    replication_factor: _Whole | None = Field(description="a whole number or None")
    slot_wait_timeout_s: _Seconds = _Timeout
    close_timeout_s: _Seconds = _Timeout
    ack_timeout_s: _Seconds = _KafkaTimeout
    kafka_timeout_s: _Seconds = _KafkaTimeout
    order_restore_timeout_s: _Seconds = _Timeout
    early_decision_ttl_s: _Seconds = _Timeout
    max_early_decisions_per_key: _Whole = _AtLeastOne
    later_inputs_while_waiting: Literal["hold", "run"] = Field(description="'hold' or 'run'")
    recovered_history_expiry_s: _Duration = Field(gt=0, description="a number of seconds (inf: never)")
    journal_enabled: _Flag = Field(description="True or False")
    accept_reexecution_after_gap: _Flag = Field(description="True or False")
    create_topic: _Flag = Field(description="True or False")
    wake_on_completion: _Flag = Field(description="True or False")
    restore_input_order: _Flag = Field(description="True or False")
    capture: _Flag = Field(description="True or False")
    signing_key: _Key | None = Field(description="a string or bytes, or None")
    verification_keys: Annotated[Sequence[_Key], AfterValidator(tuple)] = Field(
        description="a list of keys (strings or bytes)")
    journal_topic: _Text | None = Field(description="a string or None")
    uid: _Text | None = Field(description="a string or None")
    continue_job: _Text | None = Field(description="a string or None")
    capture_topic: _Text | None = Field(description="a string or None")
    kafka: _Settings = Field(description="a dict")
    topic_config: _Settings = Field(description="a dict")
    capture_topic_config: _Settings = Field(description="a dict")
    output_topics: _Texts = Field(description="a list of topic names (a list, not one string)")
    accept_moved_journal_from: _Text | _Texts | None = Field(
        description="a topic id, a list of them, or None")


def _checked_settings(config: AgentConfig) -> dict[str, Any]:
    """Each typed setting of ``config`` as the package uses it (plain Python values); :class:`ConfigError` naming
    the first that does not have its type or is out of its limits."""
    given = {name: getattr(config, name) for name in _TypedSettings.model_fields}
    try:
        checked = _TypedSettings.model_validate(given)
    except pydantic.ValidationError as exc:
        errors = exc.errors(include_url=False)
        error = next((e for e in errors if e["type"] not in _LIMITS), errors[0])  # a wrong type first
        name = error["loc"][0]
        raise ConfigError(_problem(name, given[name], error["type"])) from None
    return {name: getattr(checked, name) for name in given}


#: What a setting of the right type must be when pydantic finds it out of a limit, by pydantic's error type.
_LIMITS = {"greater_than_equal": "at least {ge}", "greater_than": "positive", "less_than_equal": "at most {le}"}


def _problem(name: str, value: Any, error_type: str) -> str:
    setting = _TypedSettings.model_fields[name]
    if error_type in _LIMITS:
        limits = {key: getattr(limit, key) for limit in setting.metadata for key in ("ge", "le")
                  if hasattr(limit, key)}
        bound = "between {ge} and {le}" if len(limits) == 2 else _LIMITS[error_type]
        return f"{name} must be {bound.format(**limits)}, got {value}"
    kind = type(value)
    shown = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return f"{name} must be {setting.description}, got {value!r} ({shown})"
