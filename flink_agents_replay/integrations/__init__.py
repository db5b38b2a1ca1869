"""Clients of outside services that know nothing of agents: Kafka, the openai SDK, Chroma, and the
vector-store protocol Chroma implements."""
