"""Remediation: actions, policy, safety, engine, audit and scheduler adapters."""
