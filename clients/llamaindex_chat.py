"""LlamaIndex's OpenAILike against kinetic: a chat and a stream.

    LLAMA_URL=http://127.0.0.1:8080 API_KEY=no-key-required python clients/llamaindex_chat.py
"""

import os

from llama_index.core.llms import ChatMessage
from llama_index.llms.openai_like import OpenAILike

# --8<-- [start:client]
llm = OpenAILike(model="local", api_base=os.environ.get("LLAMA_URL", "http://127.0.0.1:8080") + "/v1",
                 api_key=os.environ.get("API_KEY", "no-key-required"),
                 is_chat_model=True, context_window=2048, max_tokens=40)

messages = [ChatMessage(role="system", content="Answer briefly."),
            ChatMessage(role="user", content="What does -np do in llama-server?")]
print(llm.chat(messages).message.content)

for piece in llm.stream_chat(messages):
    print(piece.delta or "", end="", flush=True)
print()
# --8<-- [end:client]
