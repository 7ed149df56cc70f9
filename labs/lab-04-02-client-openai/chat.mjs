// Lab 04-02: talk to `kinetic serve` from Node.js 18+ with fetch and no dependencies.
//   node chat.mjs            full response, then [N token, X t/s]
//   node chat.mjs --stream   text as it arrives, then [N token, X t/s] and [fine]
const URL = (process.env.LLAMA_URL ?? "http://127.0.0.1:8080") + "/v1/chat/completions";
const stream = process.argv.includes("--stream");

const body = {
  model: "local",
  messages: [{ role: "user", content: "Elenca tre usi principali di un server locale per modelli di linguaggio (LLM)." }],
  max_tokens: 80,
  chat_template_kwargs: { enable_thinking: false },
  stream,
  // stream_options: { include_usage: true },   // variant: usage also in the last chunk
};

const res = await fetch(URL, {
  method: "POST",
  headers: {
    "Content-Type": "application/json",
    // "Authorization": `Bearer ${process.env.API_KEY ?? "segreta123"}`,   // with --api-key on the server
  },
  body: JSON.stringify(body),
});
if (!res.ok) {
  console.log(`HTTP ${res.status}: ${await res.text()}`);
  process.exit(1);
}

const tokenLine = (t) => `[${t.predicted_n} token, ${t.predicted_per_second.toFixed(1)} t/s]`;

if (!stream) {
  const r = await res.json();
  console.log(r.choices[0].message.content);
  console.log(tokenLine(r.timings));
} else {
  // Hand-written SSE parser: buffer the text, split it into lines, keep the `data:` ones.
  let buffer = "", last = null;
  read: for await (const text of res.body.pipeThrough(new TextDecoderStream())) {
    buffer += text;
    const lines = buffer.split("\n");
    buffer = lines.pop(); // the last line may be incomplete: keep it for the next read
    for (const line of lines) {
      if (!line.startsWith("data: ")) continue;
      const data = line.slice(6);
      if (data === "[DONE]") { console.log("\n" + tokenLine(last.timings)); console.log("[fine]"); break read; }
      const chunk = JSON.parse(data);
      process.stdout.write(chunk.choices[0]?.delta?.content ?? "");
      if (chunk.usage) console.log(`\n[usage: prompt=${chunk.usage.prompt_tokens} completion=${chunk.usage.completion_tokens}]`);
      if (chunk.timings) last = chunk;
    }
  }
}
