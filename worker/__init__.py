"""kp-scorer: scores ReasoningTrace documents flowing through Kafka (KnowledgePulse score)."""

__version__ = "0.1.0"
