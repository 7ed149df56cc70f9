// Node 18+ with fetch and no dependencies: one chat answer, with usage and llama.cpp's timings.
//   LLAMA_URL=http://127.0.0.1:8080 API_KEY=no-key-required node clients/fetch_chat.mjs
// --8<-- [start:client]
const base = process.env.LLAMA_URL ?? "http://127.0.0.1:8080";
const res = await fetch(`${base}/v1/chat/completions`, {
  method: "POST",
  headers: {
    "Content-Type": "application/json",
    Authorization: `Bearer ${process.env.API_KEY ?? "no-key-required"}`,
  },
  body: JSON.stringify({
    model: "local",
    messages: [{ role: "user", content: "Name three uses of a local LLM server." }],
    max_tokens: 40,
  }),
});
if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
const r = await res.json();
console.log(r.choices[0].message.content);
console.log(`[finish_reason=${r.choices[0].finish_reason} prompt=${r.usage.prompt_tokens} ` +
  `completion=${r.usage.completion_tokens}]`);
console.log(`[timings: cache_n=${r.timings.cache_n} ${r.timings.predicted_per_second.toFixed(1)} t/s]`);
// --8<-- [end:client]
