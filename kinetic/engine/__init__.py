"""Engines: what generates tokens. `base.Engine` is the interface; `llama` the llama.cpp backend."""
