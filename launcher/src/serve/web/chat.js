// Kore web chat: streams answers from this server's /v1/chat/completions.
"use strict";

const $ = (id) => document.getElementById(id);
const log = $("log"), input = $("input"), status = $("status");
const sendBtn = $("send"), stopBtn = $("stop"), thinkingBox = $("thinking");
let model = null, contextLimit = 0, history = [], controller = null;
let apiKey = sessionStorage.getItem("kore-api-key") || "";

function headers() {
  const h = { "Content-Type": "application/json" };
  if (apiKey) h["Authorization"] = "Bearer " + apiKey;
  return h;
}

async function api(path, init = {}) {
  let res = await fetch(path, { ...init, headers: headers() });
  if (res.status === 401) {
    const key = window.prompt("This server needs its API key:");
    if (key) {
      apiKey = key;
      sessionStorage.setItem("kore-api-key", key);
      res = await fetch(path, { ...init, headers: headers() });
    }
  }
  return res;
}

async function loadModel() {
  try {
    const res = await api("/v1/models");
    const body = await res.json();
    model = body.data[0].id;
    contextLimit = body.data[0].max_model_len || 0;
    $("model").textContent = model + (contextLimit ? ` · context ${contextLimit}` : "");
  } catch (e) {
    $("model").textContent = "no model: " + e;
  }
}

function bubble(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  if (text) div.textContent = text;
  log.appendChild(div);
  log.scrollTop = log.scrollHeight;
  return div;
}

function setBusy(busy) {
  sendBtn.disabled = busy;
  stopBtn.disabled = !busy;
}

function statusLine(stats, elapsed) {
  if (!stats) return "";
  const n = (v, d = 1) => (typeof v === "number" ? v.toFixed(d) : "?");
  return `${stats.generated_tokens} tokens · ${n(stats.decode_tok_per_s)} tok/s · prefill ${n(stats.prefill_tok_per_s, 0)} tok/s` +
    ` · context ${stats.context_used}/${stats.context_limit} · ${n(stats.tokens_per_step, 2)} tokens/step · ${elapsed.toFixed(1)} s`;
}

// Reads the SSE body, calling onData with each parsed `data:` payload.
async function readEvents(res, onData) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (data && data !== "[DONE]") onData(JSON.parse(data));
    }
  }
}

async function send(text) {
  history.push({ role: "user", content: text });
  bubble("user", text);
  const box = bubble("assistant", "");
  const details = document.createElement("details");
  details.className = "thinking";
  details.open = true;
  details.innerHTML = "<summary>Thinking…</summary>";
  const thought = document.createElement("div");
  details.appendChild(thought);
  const answer = document.createElement("div");
  box.appendChild(answer);
  let thinking = "", content = "", tokens = 0, stats = null;
  const start = performance.now();
  controller = new AbortController();
  setBusy(true);
  status.textContent = "Waiting…";
  try {
    const res = await api("/v1/chat/completions", {
      method: "POST",
      signal: controller.signal,
      body: JSON.stringify(request()),
    });
    if (!res.ok) {
      const body = await res.json().catch(() => ({}));
      throw new Error((body.error && body.error.message) || res.statusText);
    }
    await readEvents(res, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.kore_stats) stats = chunk.kore_stats;
      const delta = (chunk.choices && chunk.choices[0] && chunk.choices[0].delta) || {};
      if (delta.reasoning_content) {
        if (!details.parentNode) box.insertBefore(details, answer);
        thinking += delta.reasoning_content;
        thought.textContent = thinking;
        tokens++;
      }
      if (delta.content) {
        if (details.parentNode && details.open) details.open = false;
        content += delta.content;
        answer.textContent = content;
        tokens++;
      }
      const secs = (performance.now() - start) / 1000;
      status.textContent = stats ? statusLine(stats, secs) : `${tokens} chunks · ${secs.toFixed(1)} s`;
      log.scrollTop = log.scrollHeight;
    });
    const secs = (performance.now() - start) / 1000;
    details.open = false;
    details.querySelector("summary").textContent = `Thought (${thinking.length} characters)`;
    history.push({ role: "assistant", content });
    status.textContent = statusLine(stats, secs) || "Done.";
  } catch (e) {
    if (e.name === "AbortError") {
      status.textContent = "Stopped.";
      if (content) history.push({ role: "assistant", content });
    } else {
      box.classList.add("error");
      answer.textContent = content + (content ? "\n" : "") + "Error: " + e.message;
      status.textContent = "Error.";
      history.pop();
    }
  } finally {
    controller = null;
    setBusy(false);
    input.focus();
  }
}

function request() {
  const body = { model, messages: history, stream: true, chat_template_kwargs: { enable_thinking: thinkingBox.checked } };
  const max = parseInt($("max-tokens").value, 10);
  if (max > 0) body.max_tokens = max;
  return body;
}

function stop() {
  if (controller) controller.abort();
}

function newChat() {
  stop();
  history = [];
  log.replaceChildren();
  status.textContent = "New chat.";
  input.focus();
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = input.value.trim();
  if (!text || controller) return;
  input.value = "";
  send(text);
});
input.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $("composer").requestSubmit();
  }
});
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape") stop();
});
stopBtn.addEventListener("click", stop);
$("new-chat").addEventListener("click", newChat);
loadModel();
