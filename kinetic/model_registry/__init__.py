"""Router mode: several models at one address (local GGUFs, embedding models, remote upstreams)."""
