"""flink-agents-replay: durable, exactly-once-effect agent actions and safe replay on Apache Flink."""

__version__ = "0.1.0"
