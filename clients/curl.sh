#!/usr/bin/env sh
# The same server with curl: OpenAI chat, a streamed chat, llama-server's /completion and /tokenize.
#   LLAMA_URL=http://127.0.0.1:8080 API_KEY=no-key-required sh clients/curl.sh
set -eu
URL="${LLAMA_URL:-http://127.0.0.1:8080}"
KEY="${API_KEY:-no-key-required}"

# --8<-- [start:chat]
curl -sS --fail-with-body "$URL/v1/chat/completions" \
  -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" \
  -d '{"model": "local", "max_tokens": 20,
       "messages": [{"role": "user", "content": "Hello!"}]}'
echo
# --8<-- [end:chat]

# --8<-- [start:stream]
curl -sS -N --fail-with-body "$URL/v1/chat/completions" \
  -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" \
  -d '{"model": "local", "max_tokens": 10, "stream": true,
       "messages": [{"role": "user", "content": "Hello!"}]}'
# --8<-- [end:stream]

# --8<-- [start:native]
curl -sS --fail-with-body "$URL/completion" \
  -H "Authorization: Bearer $KEY" \
  -d '{"prompt": "The capital of France is", "n_predict": 10}'
echo
curl -sS --fail-with-body "$URL/tokenize" \
  -H "Authorization: Bearer $KEY" \
  -d '{"content": "Hello world", "with_pieces": true}'
echo
# --8<-- [end:native]
