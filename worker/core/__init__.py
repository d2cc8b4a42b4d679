"""Pure scoring: trace and schema, scoring, novelty caches, embedder, wire format. No Kafka."""
