"""Sinks: where the agent's encoded messages go (Kafka, or stdout for debugging).

A sink is picked by name from :data:`collector.sinks.base.SINKS`; the agent keeps a
bounded buffer (:mod:`collector.sinks.buffer`) in front of it, so a sink only has to
say how many messages of a batch it delivered, in order.
"""
