"""Collector: the telemetry contract, recordings, sources (hardware, simulator) and sinks."""
