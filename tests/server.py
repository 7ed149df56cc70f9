"""The tests' server helper is the package's (kinetic.launch), shared with bench/ and scripts/."""

from kinetic.launch import MODEL_LOCK_PATH, STARTUP_TIMEOUT_S, KineticServer, free_port

__all__ = ["MODEL_LOCK_PATH", "STARTUP_TIMEOUT_S", "KineticServer", "free_port"]
