"""What more than one protocol adapter shares: wire models (types.py) and pure helpers (translate.py)."""
