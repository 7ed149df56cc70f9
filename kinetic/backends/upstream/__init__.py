"""Remote models: an OpenAI-compatible server (vLLM, llama-server, another kinetic) behind kinetic.

The upstream wants messages, not token prompts, so it is a backend of its own (backend.py) beside the
local one: `prepare_chat` turns the neutral ChatRequest every protocol translator produces into an
OpenAI chat-completions body (body.py) instead of rendering and tokenizing it, and `start` forwards
it and reads the upstream's SSE answer back into kinetic's neutral events (stream.py): text deltas,
then a Finished with usage, llama-server's timings when the upstream sends them, and the tool calls
as structure. The classroom layer stays in front: key names, the per-key in-flight limit (429), a
waiting line fair across keys when every upstream connection is busy (line.py), the ledger.

Several upstreams under one name form a pool (pool.py): each request goes to the member that holds
its conversation in its cache, within load bounds (affinity.py; the load as the members count it,
load.py); a member that fails is taken out of rotation and probed again, one drained takes nothing new.
"""
