"""Kafka: clients, topics, the Faust app. The only package that talks to a broker."""
