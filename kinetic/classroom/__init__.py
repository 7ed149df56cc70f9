"""The classroom layer: key names (who is asking) and the request ledger (what they got).

Nothing here imports the server's dependencies at module level, so the grader can read a ledger
in an environment without `kinetic[serve]`.
"""
