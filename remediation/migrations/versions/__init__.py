"""Migration scripts of the action store, oldest first by ``down_revision``."""
