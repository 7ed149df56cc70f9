// Node 18+ with fetch and no dependencies: a streamed chat, read as server-sent events.
//   LLAMA_URL=http://127.0.0.1:8080 API_KEY=no-key-required node clients/fetch_stream.mjs
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
    messages: [{ role: "user", content: "What is a token?" }],
    max_tokens: 40,
    stream: true,
  }),
});
if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);

let buffer = "";
let timings = null;
for await (const text of res.body.pipeThrough(new TextDecoderStream())) {
  buffer += text;
  const lines = buffer.split("\n");
  buffer = lines.pop(); // an incomplete line waits for the next read
  for (const line of lines) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    const chunk = JSON.parse(line.slice(6));
    process.stdout.write(chunk.choices[0]?.delta?.content ?? "");
    if (chunk.timings) timings = chunk.timings; // the last chunk carries llama.cpp's timings
  }
}
console.log(`\n[${timings.predicted_n} tokens, ${timings.predicted_per_second.toFixed(1)} t/s]`);
// --8<-- [end:client]
