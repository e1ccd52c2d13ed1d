"""Pipeline: bus consumers, decoding and validation, dead-lettering, window state and features."""
