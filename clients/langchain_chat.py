"""LangChain's ChatOpenAI against kinetic: a call, a stream and a structured answer.

    LLAMA_URL=http://127.0.0.1:8080 API_KEY=no-key-required python clients/langchain_chat.py
"""

import os

from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

# --8<-- [start:client]
llm = ChatOpenAI(base_url=os.environ.get("LLAMA_URL", "http://127.0.0.1:8080") + "/v1",
                 api_key=os.environ.get("API_KEY", "no-key-required"), model="local", max_tokens=60,
                 temperature=0)  # greedy: the same answer on every run

reply = llm.invoke("Say hello to the class.")
print(reply.content)
print(f"[usage: {reply.usage_metadata['input_tokens']} in, {reply.usage_metadata['output_tokens']} out]")

for piece in llm.stream("Count to five."):
    print(piece.content, end="", flush=True)
print()


class City(BaseModel):
    name: str = Field(max_length=12)  # bounded, so the JSON always fits in max_tokens
    country: str = Field(max_length=12)


# json_schema output is grammar-constrained by the server: always a valid City, whatever the model
city = llm.with_structured_output(City, method="json_schema", strict=True).invoke("Name a city in Italy.")
print(f"[structured: {city!r}]")
# --8<-- [end:client]
