"""kinetic: a llama-server compatible HTTP server over llama-cpp-python."""

__version__ = "0.1.0"
