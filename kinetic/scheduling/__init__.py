"""The class's rules for sharing a model, below every backend: the waiting line fair across keys (fairqueue.py) and
the limit of requests a key may have in flight (inflight.py). The llama engine and the upstream backend both
enforce them; the classroom layer above sets them."""
