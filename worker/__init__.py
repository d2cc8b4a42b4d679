"""kp-scorer: scores ReasoningTrace documents flowing through Kafka with the KnowledgePulse score."""

__version__ = "0.1.0"
