"""What user code imports: agents and actions, resources and tools, chat models, the tool loop, short-term
memory. Flink-free."""
