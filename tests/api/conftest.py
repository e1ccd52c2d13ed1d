"""Fixtures of the API and service tests: fresh Kafka topics for a ``serve`` process."""

from __future__ import annotations

from tests.api.serve_proc import serve_topics  # noqa: F401 - a fixture, registered by importing it here
