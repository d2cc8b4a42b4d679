"""Pure scoring: trace and schema, scoring, novelty caches, wire format. No Kafka."""
