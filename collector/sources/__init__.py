"""Telemetry sources: each reads one kind of hardware (or the simulator) from an injectable root."""
