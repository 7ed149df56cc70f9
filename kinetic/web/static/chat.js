// The chat page: /props for the model, then /v1/chat/completions streamed and read by hand (fetch +
// an SSE line reader, as labs/lab-04-02-client-openai/chat.mjs does), so the numbers a student
// learns to read appear under each answer: prompt tokens, cache_n, TTFT and tokens/s.
"use strict";

const $ = (id) => document.getElementById(id);
const keyStore = kinetic.keyStore("kinetic.apiKey");
// `images`: data: URLs attached to the next message (the model's projector reads them); `chatId`: this
// conversation's name on the server when it keeps chats (`history`: --chat-history is on)
// `streamId`: the X-Conversation-Id of the answer under way (null when none is)
const state = { model: "", messages: [], controller: null, streamId: null, images: [], chatId: null, history: false,
  greeting: "" };

function setStatus(text) {
  $("status").textContent = text;
}

// GET with the key; asks for one on 401 and waits while the model loads (503).
async function getJSON(path) {
  for (;;) {
    const res = await fetch(path, { headers: kinetic.headers(keyStore.get()) });
    if (res.ok) return res.json();
    if (res.status === 401) {
      setStatus("this server needs an API key");
      await kinetic.askKey($("key-form"), keyStore,
        keyStore.get() ? "That key was refused: try again." : "This server needs an API key.");
    } else if (res.status === 503) {
      setStatus("loading the model…");
      await kinetic.sleep(1000);
    } else {
      throw new Error(await kinetic.errorText(res));
    }
  }
}

async function loadProps() {
  const config = await (await fetch("/ui/config.json")).json();
  if (config.api_key_required && !keyStore.get()) {
    setStatus("this server needs an API key");
    await kinetic.askKey($("key-form"), keyStore, "This server needs an API key.");
  }
  state.history = Boolean(config.chat_history);
  const props = await getJSON("/props");
  if (props.role === "router") {
    // several models (router mode): the student picks one; it loads on its first request
    const models = (await getJSON("/v1/models")).data.map((m) => m.id);
    const select = $("model-select");
    select.replaceChildren(...models.map((id) => new Option(id, id)));
    select.onchange = () => { state.model = select.value; };
    state.model = select.value;
    select.hidden = false;
    $("model").hidden = true;
    $("ctx").textContent = "router";
    state.greeting = "Pick a model above (it loads on its first request), then say hello.";
  } else {
    state.model = props.model_alias || "";
    $("model").textContent = state.model;
    const nCtx = props.default_generation_settings?.n_ctx ?? "?";
    $("ctx").textContent = `n_ctx ${nCtx}`;
    $("attach").hidden = !props.modalities?.vision; // only a model with a projector reads images
    state.greeting = `You are talking to ${state.model}, with ${nCtx} tokens of context. Say hello below.`;
    const origin = props.chat_template_origin ?? "";
    if (origin.startsWith("builtin:")) { // the GGUF brought no template: a base model continues text, it does not chat
      state.greeting += ` Its file has no chat template, so kinetic formats the chat with the built-in ` +
        `${origin.slice("builtin:".length)} template; a base model may answer with a continuation of your text.`;
    }
  }
  greet();
  setStatus("ready");
  $("send").disabled = false;
  loadStanding().catch(() => {});
  if (state.history) await refreshHistory();
  if (!state.controller) await resumeAnswer();
}

// One line for the key's own standing (GET /v1/me): its name, tokens left and when they reset, why
// it is refused now (outside its lesson hours), the models it may use.
async function loadStanding() {
  const res = await fetch("/v1/me", { headers: kinetic.headers(keyStore.get()) });
  if (!res.ok) return;
  const me = await res.json();
  const parts = [];
  if (me.name) parts.push(me.name);
  if (me.budget) {
    const resets = new Date(me.budget.resets_at).toLocaleString();
    parts.push(`${me.budget.left} of ${me.budget.limit} tokens left this ${me.budget.period} (resets ${resets})`);
  }
  if (me.limits?.hours?.length) parts.push(`hours ${me.limits.hours.join(", ")}`);
  if (me.limits?.models) parts.push(`models ${me.limits.models.join(", ")}`);
  if (me.refused) parts.push(me.refused);
  $("standing").textContent = parts.join(" · ");
  $("standing").hidden = parts.length === 0;
}

// A chat's name on the server: random, and made without crypto.randomUUID, which a page served over plain
// http from another machine (a lab PC) does not have.
function newChatId() {
  return Array.from(crypto.getRandomValues(new Uint8Array(12)), (b) => b.toString(16).padStart(2, "0")).join("");
}

function textOf(content) {
  return typeof content === "string" ? content : content.filter((p) => p.type === "text").map((p) => p.text).join(" ");
}

async function refreshHistory() {
  const chats = (await getJSON("/chats")).data;
  const select = $("history");
  const options = chats.map((chat) => {
    const when = new Date(chat.updated * 1000).toLocaleString();
    return new Option(`${chat.title || "(untitled)"} · ${chat.n_messages} messages · ${when}`, chat.id);
  });
  select.replaceChildren(new Option(`saved chats (${chats.length})`, ""), ...options);
  select.value = state.chatId && chats.some((chat) => chat.id === state.chatId) ? state.chatId : "";
  select.hidden = false;
  $("delete-chat").hidden = !state.chatId;
}

async function saveChat() {
  state.chatId ??= newChatId();
  const firstQuestion = state.messages.find((m) => m.role === "user");
  const body = { title: firstQuestion ? textOf(firstQuestion.content).slice(0, 80) : "", messages: state.messages };
  const res = await fetch(`/chats/${state.chatId}`, {
    method: "PUT",
    headers: kinetic.headers(keyStore.get(), { "Content-Type": "application/json" }),
    body: JSON.stringify(body),
  });
  if (!res.ok) throw new Error(`chat not saved: ${await kinetic.errorText(res)}`);
  await refreshHistory();
}

function showConversation(messages) {
  $("log").replaceChildren();
  for (const message of messages) {
    if (message.role === "user") {
      const images = typeof message.content === "string" ? []
        : message.content.filter((p) => p.type === "image_url").map((p) => p.image_url.url);
      addTurn("user", textOf(message.content), images);
    } else if (message.role === "assistant") {
      addTurn("assistant").querySelector(".content").textContent = textOf(message.content ?? "");
    }
  }
  greet();
}

async function openChat(id) {
  const chat = await getJSON(`/chats/${id}`);
  state.chatId = chat.id;
  state.messages = chat.messages;
  showConversation(chat.messages);
  $("delete-chat").hidden = false;
  setStatus("ready");
}

function startNewChat() {
  stopAnswer();
  state.messages = [];
  state.images = [];
  state.chatId = null;
  showAttachments();
  $("log").replaceChildren();
  greet();
  if (state.history) $("history").value = "";
  $("delete-chat").hidden = true;
}

// What an empty chat shows: the model it talks to, and what to expect of it.
function greet() {
  if ($("log").querySelector(".turn") || !state.greeting) return;
  const greeting = document.createElement("p");
  greeting.className = "greeting";
  greeting.textContent = state.greeting;
  $("log").replaceChildren(greeting);
}

function thumbnail(url) {
  const img = document.createElement("img");
  img.src = url;
  img.className = "thumb";
  img.alt = "attached image";
  return img;
}

function addTurn(role, text, images = []) {
  const turn = document.createElement("article");
  turn.className = `turn ${role}`;
  $("log").querySelector(".greeting")?.remove();
  if (role === "user") {
    turn.textContent = text;
    if (images.length) turn.append(document.createElement("br"), ...images.map(thumbnail));
  } else {
    turn.innerHTML = '<details class="reasoning" hidden><summary>thinking</summary><pre></pre></details>' +
      '<div class="content"></div><div class="stats"></div>';
  }
  $("log").append(turn);
  turn.scrollIntoView({ block: "end" });
  return turn;
}

function requestBody() {
  const extraText = $("extra").value.trim();
  let extra = {};
  if (extraText) {
    extra = JSON.parse(extraText); // a syntax error is shown to the student as is
    if (typeof extra !== "object" || Array.isArray(extra)) throw new Error("request options: expected a JSON object");
  }
  return {
    model: state.model,
    messages: state.messages,
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: Number($("max-tokens").value) || 256,
    chat_template_kwargs: { enable_thinking: $("thinking").checked },
    ...extra,
  };
}

function showNumbers(stats, numbers) {
  const parts = [];
  const add = (name, label, value) => {
    if (value === undefined || value === null) return;
    const span = document.createElement("span");
    span.dataset.name = name;
    span.textContent = `${label} ${value}`;
    parts.push(span);
  };
  add("prompt-tokens", "prompt tokens", numbers.promptTokens);
  add("cache-n", "cache_n", numbers.cacheN);
  add("ttft", "TTFT", numbers.ttftMs === undefined ? undefined : `${Math.round(numbers.ttftMs)} ms`);
  add("tokens-per-second", "tokens/s", numbers.tokensPerSecond?.toFixed(1));
  add("completion-tokens", "generated", numbers.completionTokens);
  if (numbers.note) add("note", "", numbers.note);
  stats.replaceChildren(...parts);
}

// Reads `data:` lines of an SSE body as they arrive; calls onChunk with each parsed JSON chunk.
async function readEvents(res, onChunk) {
  let buffer = "";
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    const lines = buffer.split("\n");
    buffer = lines.pop(); // the last line may be incomplete: keep it for the next read
    for (const line of lines) {
      if (!line.startsWith("data: ")) continue;
      const data = line.slice(6);
      if (data === "[DONE]") return;
      onChunk(JSON.parse(data));
    }
  }
}

// The message as OpenAI's content parts when images are attached, plain text otherwise.
function userContent(text, images) {
  if (!images.length) return text;
  return [{ type: "text", text }, ...images.map((url) => ({ type: "image_url", image_url: { url } }))];
}

function showAttachments() {
  const box = $("attachments");
  box.replaceChildren(...state.images.map(thumbnail));
  box.hidden = state.images.length === 0;
}

async function attach(files) {
  for (const file of files) {
    if (!file.type.startsWith("image/")) continue;
    state.images.push(await new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    }));
  }
  showAttachments();
}

// The answer being streamed, kept in this tab's sessionStorage while it comes: its stream id (sent as
// X-Conversation-Id, so the server keeps generating it when the page goes away) and the conversation up to
// its question. A reload mid-answer reads it back and picks the answer up from GET /v1/stream.
const PENDING = "kinetic.pendingAnswer";

function rememberPending(pending) {
  try {
    sessionStorage.setItem(PENDING, JSON.stringify(pending));
  } catch {
    // a conversation too large for sessionStorage (many images): this answer is not resumable, nothing else changes
  }
}

function pendingAnswer() {
  try {
    return JSON.parse(sessionStorage.getItem(PENDING) ?? "null");
  } catch {
    return null;
  }
}

async function send(text) {
  let body;
  const images = state.images;
  try {
    state.messages.push({ role: "user", content: userContent(text, images) });
    body = requestBody();
  } catch (error) {
    state.messages.pop();
    setStatus(String(error.message ?? error));
    return;
  }
  state.images = [];
  showAttachments();
  addTurn("user", text, images);
  const streamId = newChatId();
  rememberPending({ streamId, chatId: state.chatId, messages: state.messages });
  await followAnswer(addTurn("assistant"), streamId, (signal) => fetch("/v1/chat/completions", {
    method: "POST",
    headers: kinetic.headers(keyStore.get(), { "Content-Type": "application/json", "X-Conversation-Id": streamId }),
    body: JSON.stringify(body),
    signal,
  }));
}

// After a reload: the answer that was still coming, read again from its first byte and then live.
async function resumeAnswer() {
  const pending = pendingAnswer();
  if (!pending?.streamId || !Array.isArray(pending.messages)) return;
  state.messages = pending.messages;
  state.chatId = pending.chatId ?? null;
  showConversation(state.messages);
  const url = `/v1/stream?conv_id=${encodeURIComponent(pending.streamId)}&from=0`;
  await followAnswer(addTurn("assistant"), pending.streamId,
    (signal) => fetch(url, { headers: kinetic.headers(keyStore.get()), signal }), { resumed: true });
}

// Stops the answer under way: the fetch ends, and the server stops generating it (the stream id keeps a
// generation going past its connection, so closing the connection alone would not).
function stopAnswer() {
  if (!state.controller) return;
  state.controller.abort();
  fetch(`/v1/stream?conv_id=${encodeURIComponent(state.streamId)}`, {
    method: "DELETE", headers: kinetic.headers(keyStore.get()),
  }).catch(() => {});
}

async function followAnswer(turn, streamId, request, { resumed = false } = {}) {
  const content = turn.querySelector(".content");
  const reasoningBox = turn.querySelector(".reasoning");
  const reasoning = reasoningBox.querySelector("pre");
  const stats = turn.querySelector(".stats");
  const numbers = {};
  let answer = "";

  state.controller = new AbortController();
  state.streamId = streamId;
  $("send").disabled = true;
  $("stop").disabled = false;
  setStatus(resumed ? "picking the answer up again…" : "generating…");
  turn.classList.add("streaming");
  const started = performance.now();
  let reloading = false;
  const noteReload = () => { reloading = true; };
  window.addEventListener("pagehide", noteReload);
  try {
    const res = await request(state.controller.signal);
    if (!res.ok) {
      const message = await kinetic.errorText(res);
      if (res.status === 401) keyStore.clear();
      throw new Error(res.status === 404 && resumed ? "the unfinished answer is no longer kept on the server" : message);
    }
    if (resumed) setStatus("generating…");
    await readEvents(res, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message ?? JSON.stringify(chunk.error));
      const delta = chunk.choices?.[0]?.delta ?? {};
      // a resumed answer's first token came before the reload: no TTFT to show
      if ((delta.content || delta.reasoning_content) && numbers.ttftMs === undefined && !resumed) {
        numbers.ttftMs = performance.now() - started;
      }
      if (delta.reasoning_content) {
        reasoningBox.hidden = false;
        reasoning.textContent += delta.reasoning_content;
      }
      if (delta.content) {
        answer += delta.content;
        content.textContent = answer;
        turn.scrollIntoView({ block: "end" });
      }
      if (chunk.usage) {
        numbers.promptTokens = chunk.usage.prompt_tokens;
        numbers.completionTokens = chunk.usage.completion_tokens;
      }
      if (chunk.timings) {
        numbers.cacheN = chunk.timings.cache_n;
        numbers.tokensPerSecond = chunk.timings.predicted_per_second;
        numbers.promptTokens ??= chunk.timings.prompt_n + chunk.timings.cache_n;
      }
    });
    if (resumed) numbers.note = "resumed after a reload";
    setStatus("ready");
  } catch (error) {
    if (error.name === "AbortError") {
      numbers.note = "stopped";
      setStatus("stopped: the server freed the slot");
    } else {
      turn.classList.add("failed");
      content.textContent = answer + (answer ? "\n" : "") + String(error.message ?? error);
      setStatus("error");
      if (String(error.message).startsWith("HTTP 401")) loadProps().catch((e) => setStatus(String(e.message)));
    }
  } finally {
    window.removeEventListener("pagehide", noteReload);
    turn.classList.remove("streaming");
    showNumbers(stats, numbers);
    // the page going away mid-answer: the answer stays pending, for the reloaded page to pick up
    if (!reloading) sessionStorage.removeItem(PENDING);
    const answered = Boolean(answer || numbers.note);
    if (answered) state.messages.push({ role: "assistant", content: answer });
    else state.messages.pop(); // nothing came back: the question is not part of the conversation
    state.controller = null;
    state.streamId = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    loadStanding().catch(() => {});
    if (answered && state.history && !reloading) saveChat().catch((error) => setStatus(String(error.message ?? error)));
  }
}

$("chat-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("message").value.trim();
  if ((!text && !state.images.length) || state.controller) return;
  $("message").value = "";
  send(text);
});

$("message").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("chat-form").requestSubmit();
  }
});

$("image-input").addEventListener("change", (event) => {
  attach([...event.target.files]).catch((error) => setStatus(String(error.message ?? error)));
  event.target.value = "";
});

// A screenshot pasted into the message box is attached, as chat apps do.
$("message").addEventListener("paste", (event) => {
  const files = [...(event.clipboardData?.files ?? [])].filter((f) => f.type.startsWith("image/"));
  if (!files.length) return;
  event.preventDefault();
  attach(files).catch((error) => setStatus(String(error.message ?? error)));
});

$("stop").addEventListener("click", stopAnswer);

$("new-chat").addEventListener("click", startNewChat);

$("history").addEventListener("change", (event) => {
  if (state.controller) { event.target.value = state.chatId ?? ""; return; } // mid-answer: finish first
  if (!event.target.value) { startNewChat(); return; }
  openChat(event.target.value).catch((error) => setStatus(String(error.message ?? error)));
});

$("delete-chat").addEventListener("click", async () => {
  if (!state.chatId) return;
  const res = await fetch(`/chats/${state.chatId}`, { method: "DELETE", headers: kinetic.headers(keyStore.get()) });
  if (!res.ok) { setStatus(`not deleted: ${await kinetic.errorText(res)}`); return; }
  startNewChat();
  await refreshHistory();
});

loadProps().catch((error) => setStatus(String(error.message ?? error)));
