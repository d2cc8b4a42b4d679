"""Running the scorer over a stream: per-partition state, the record pipeline, metrics."""
