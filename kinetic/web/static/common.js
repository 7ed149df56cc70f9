// Shared by the chat page and the dashboard: the key (kept in this tab's sessionStorage only, never
// in localStorage or a cookie) and a fetch that sends it.
"use strict";

const kinetic = {
  keyStore(name) {
    return {
      get: () => sessionStorage.getItem(name) || "",
      set: (value) => sessionStorage.setItem(name, value),
      clear: () => sessionStorage.removeItem(name),
    };
  },

  headers(key, extra = {}) {
    const headers = { ...extra };
    if (key) headers["Authorization"] = `Bearer ${key}`;
    return headers;
  },

  // The message of an error body in any of the server's envelopes, else the status line.
  async errorText(res) {
    const text = await res.text();
    try {
      const body = JSON.parse(text);
      const error = body.error ?? body;
      return `HTTP ${res.status}: ${typeof error === "string" ? error : error.message ?? text}`;
    } catch {
      return `HTTP ${res.status}: ${text}`;
    }
  },

  // Shows the key form and resolves with the key typed in (stored for this tab).
  askKey(form, store, message) {
    const input = form.querySelector("input");
    form.querySelector(".key-message").textContent = message;
    form.hidden = false;
    input.focus();
    return new Promise((resolve) => {
      form.onsubmit = (event) => {
        event.preventDefault();
        store.set(input.value.trim());
        input.value = "";
        form.hidden = true;
        resolve(store.get());
      };
    });
  },

  sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
};
