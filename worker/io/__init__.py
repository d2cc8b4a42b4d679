"""Kafka: clients, topics, the group consumer, the Faust app. The only package that talks to a
broker."""
