"""One package per wire protocol, each with types.py, translate.py and routes.py."""
