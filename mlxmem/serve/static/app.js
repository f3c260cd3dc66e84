// The mlxmem page: a chat that streams, the facts, the context fill and the history, all
// through the same HTTP API as any other client. No framework, no build step.
"use strict";

const LAYERS = ["instructions", "facts", "summary", "turns", "recall", "reserve", "free"];
const $ = (id) => document.getElementById(id);
let model = null;
let running = null; // the AbortController of the reply being streamed

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
}

let defaultConversation = "default"; // the server's --conversation, read at start

function conversation() {
  return $("conversation").value.trim() || defaultConversation;
}

function say(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

async function api(method, path, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const data = await response.json();
  if (!response.ok) throw new Error(data.error ? data.error.message : response.statusText);
  return data;
}

// -- the chat ------------------------------------------------------------------------------

function bubble(role, text, turn) {
  const body = el("div", { class: "text" }, text);
  const node = el("div", { class: `message ${role}` }, body);
  if (turn) {
    if (turn.interrupted) node.append(el("span", { class: "note" }, "interrupted"));
    node.append(el("button", { class: "delete", title: "delete this turn for good",
      onclick: () => deleteTurn(turn.id) }, "×"));
  }
  $("messages").append(node);
  $("messages").scrollTop = $("messages").scrollHeight;
  return body;
}

async function loadTurns() {
  const name = encodeURIComponent(conversation());
  let turns = [];
  try {
    turns = (await api("GET", `/v1/memory/conversations/${name}`)).data;
  } catch (error) {
    // A conversation with no turns yet is not an error here.
  }
  $("messages").replaceChildren(); // after the fetch: the old turns stay until the new come
  for (const turn of turns) bubble(turn.role, turn.text, turn);
}

async function send(text) {
  bubble("user", text);
  const reply = bubble("assistant", "");
  running = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  say("writing…");
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({
        model,
        stream: true,
        user: conversation(), // not the header: a header cannot carry every name
        messages: [{ role: "user", content: text }],
      }),
      signal: running.signal,
    });
    if (!response.ok) throw new Error((await response.json()).error.message);
    await readEvents(response, (event) => {
      if (event.error) throw new Error(event.error.message);
      for (const choice of event.choices) reply.textContent += choice.delta.content || "";
      const noted = (event.mlxmem && event.mlxmem.facts_added) || [];
      if (noted.length) say(`remembered: ${noted.map((f) => f.text).join("; ")}`);
    });
    if ($("status").textContent === "writing…") say("");
  } catch (error) {
    if (error.name !== "AbortError") {
      say(error.message, true);
    } else {
      say("stopped (kept in the log as interrupted)");
      await replyLogged();
    }
  } finally {
    $("stop").disabled = true;
    await refresh(); // the logged turns, facts and context, before the next message
    running = null;
    $("send").disabled = false;
  }
}

// The server logs a stopped reply once it sees the connection closed: wait for it (briefly).
async function replyLogged() {
  const name = encodeURIComponent(conversation());
  for (let i = 0; i < 20; i++) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    const turns = await api("GET", `/v1/memory/conversations/${name}`).catch(() => null);
    if (!turns || (turns.data.length && turns.data[turns.data.length - 1].role === "assistant")) {
      return;
    }
  }
}

// Server-sent events from a fetch body: `data: {...}` blocks separated by blank lines.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      if (!block.startsWith("data: ") || block === "data: [DONE]") continue;
      onEvent(JSON.parse(block.slice(6)));
    }
  }
}

// Every deletion answers with the sentence the command line prints.
async function remove(path) {
  try {
    say((await api("DELETE", path)).message);
  } catch (error) {
    say(error.message, true);
  }
  await refresh();
}

// Deleting a fact lists the turns of the log that still quote it, and deleting a message
// the turns that may repeat it (its reply): the API's `mentions`, each with a way to delete
// it, as `mlxmem memory rm` and `mlxmem history rm` do.
const deleteTurn = (id) => removeQuoted(`/v1/memory/turns/${id}`, "message");
const deleteFact = (id) => removeQuoted(`/v1/memory/facts/${id}`, "fact");
const deleteConversation = (name) =>
  remove(`/v1/memory/conversations/${encodeURIComponent(name)}`);

async function removeQuoted(path, what) {
  let deletion = null;
  try {
    deletion = await api("DELETE", path);
    say(deletion.message);
  } catch (error) {
    say(error.message, true);
  }
  showMentions(deletion ? deletion.mentions : [], what);
  await refresh();
}

let mentions = []; // the turns listed as still quoting what was deleted
let mentionsOf = "fact"; // what that was: a "fact" or a "message"

function showMentions(turns, what = mentionsOf) {
  mentions = turns;
  mentionsOf = what;
  const box = $("mentions");
  const items = turns.map((turn) => el("li", { class: "mention", "data-id": turn.id },
    el("span", { class: "where" }, `${turn.conversation} #${turn.seq} ${turn.role}`),
    el("span", { class: "text" }, turn.text),
    el("button", { class: "delete", onclick: () => deleteMentions([turn.id]) }, "delete")));
  box.replaceChildren();
  box.hidden = !items.length;
  if (!items.length) return;
  const one = items.length === 1;
  box.append(
    el("p", {}, `${one ? "This turn" : `These ${items.length} turns`} of the log `
      + (what === "fact" ? `still quote${one ? "s" : ""} the deleted fact:`
        : "may still repeat the deleted message:")),
    el("ul", {}, ...items),
    el("button", { class: "delete-all",
      onclick: () => deleteMentions(turns.map((turn) => turn.id)) },
    one ? "delete it" : "delete them all"),
    el("button", { class: "keep", onclick: () => showMentions([]) }, "keep them"));
}

async function deleteMentions(ids) {
  const gone = [];
  try {
    let message = "";
    for (const id of ids) {
      message = (await api("DELETE", `/v1/memory/turns/${id}`)).message;
      gone.push(id);
    }
    say(ids.length === 1 ? message : `Deleted ${ids.length} turns.`);
  } catch (error) {
    say(error.message, true);
  }
  showMentions(mentions.filter((turn) => !gone.includes(turn.id)));
  await refresh();
}

// -- the facts -----------------------------------------------------------------------------

// Replaced facts are listed too, after the current ones, marked with the fact that replaced
// them: out of the prompt, still the person's to read and delete.
async function loadFacts() {
  const facts = await api("GET", "/v1/memory/facts?all=true");
  const ordered = [...facts.data.filter((f) => f.replaced_by === null),
    ...facts.data.filter((f) => f.replaced_by !== null)];
  $("facts").replaceChildren(...ordered.map(factItem));
  if (!facts.data.length) $("facts").append(el("li", { class: "empty" }, "nothing yet"));
}

function factItem(fact) {
  const text = el("span", { class: "text" }, fact.text);
  const replaced = fact.replaced_by === null ? [] : [el("span", { class: "replaced" },
    `replaced by ${fact.replaced_by} on ${fact.replaced_at.slice(0, 10)}`)];
  const item = el("li", { class: fact.replaced_by === null ? "fact" : "fact replaced",
    "data-id": fact.id }, el("span", { class: `tag ${fact.source}` }, fact.source), text,
    ...replaced);
  const edit = el("button", { class: "edit", onclick: () => startEdit(item, fact) }, "edit");
  const remove = el("button", { class: "delete", onclick: () => deleteFact(fact.id) }, "delete");
  if (fact.replaced_by !== null) {
    item.append(el("button", { class: "restore", onclick: () => restoreFact(fact.id) },
      "restore"));
  }
  item.append(edit, remove);
  return item;
}

// A replacement made in error (an automatic one can be): the old fact is current again.
async function restoreFact(id) {
  try {
    await api("POST", `/v1/memory/facts/${id}/restore`, {});
    say("fact restored: current again, back in the prompt");
  } catch (error) {
    say(error.message, true);
  }
  await refresh();
}

function startEdit(item, fact) {
  const input = el("input", { class: "edit-text", value: fact.text });
  const save = el("button", { class: "save", onclick: () => saveFact(fact.id, input.value) },
    "save");
  item.replaceChildren(el("span", { class: `tag ${fact.source}` }, fact.source), input, save);
  input.focus();
}

async function saveFact(id, text) {
  try {
    await api("PATCH", `/v1/memory/facts/${id}`, { text });
    say("fact updated; the old text is erased");
  } catch (error) {
    say(error.message, true);
  }
  await refresh();
}

// -- the context and the history -----------------------------------------------------------

async function loadContext() {
  const name = encodeURIComponent(conversation());
  const context = await api("GET", `/v1/memory/context?conversation=${name}`);
  $("context-budget").textContent = `${context.budget} tokens`;
  const parts = LAYERS.map((layer) => [layer, context.layers[layer]]);
  $("context-bar").replaceChildren(...parts.filter(([, n]) => n > 0).map(([layer, n]) =>
    el("span", { class: `layer ${layer}`, style: `width: ${(100 * n) / context.budget}%`,
      title: `${layer}: ${n} tokens` })));
  $("context-legend").replaceChildren(...parts.map(([layer, n]) =>
    el("li", { class: layer }, el("i", { class: `swatch ${layer}` }), `${layer} ${n}`)));
}

let armed = null; // the conversation whose delete button was clicked once

async function loadConversations() {
  const list = await api("GET", "/v1/memory/conversations");
  $("conversations").replaceChildren(...list.data.map((c) => {
    const open = el("button", { class: "open", onclick: () => {
      $("conversation").value = c.name;
      refresh();
    } }, c.name);
    // A second click confirms (deleting a conversation cannot be undone), even if a refresh
    // redrew the list between the two.
    const remove = el("button", { class: "delete" }, c.name === armed ? "really delete?" : "delete");
    remove.addEventListener("click", () => {
      if (armed === c.name) {
        armed = null;
        return deleteConversation(c.name);
      }
      armed = c.name;
      remove.textContent = "really delete?";
    });
    // A private conversation is never recalled into another; a click toggles it.
    const privacy = el("button", { class: "private", title: c.private
      ? "kept out of recall in other conversations: click to let it back in"
      : "recalled in other conversations: click to keep it out" },
      c.private ? "private" : "shared");
    privacy.addEventListener("click", async () => {
      await api("PATCH", `/v1/memory/conversations/${encodeURIComponent(c.name)}`,
        { private: !c.private });
      loadConversations();
    });
    return el("li", {}, open, el("span", { class: "count" }, `${c.turn_count} turns`),
      privacy, remove);
  }));
}


// Refreshes run one after another, so a slow earlier one never overwrites a later one.
let refreshed = Promise.resolve();
function refresh() {
  refreshed = refreshed.then(async () => {
    try {
      await Promise.all([loadTurns(), loadFacts(), loadContext(), loadConversations()]);
    } catch (error) {
      say(error.message, true);
    }
  });
  return refreshed;
}

// -- wiring --------------------------------------------------------------------------------

$("send-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("input").value.trim();
  if (!text || running) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("send-form").requestSubmit();
  }
});
$("stop").addEventListener("click", () => running && running.abort());
$("fact-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = $("fact-input").value.trim();
  if (!text) return;
  try {
    await api("POST", "/v1/memory/facts", { text });
    $("fact-input").value = "";
  } catch (error) {
    say(error.message, true);
  }
  await refresh();
});
$("conversation").addEventListener("change", refresh);

(async () => {
  try {
    model = (await api("GET", "/v1/models")).data[0].id;
    $("model").textContent = model;
    defaultConversation = (await api("GET", "/v1/memory/conversations")).default;
    if (!$("conversation").value.trim()) $("conversation").value = defaultConversation;
  } catch (error) {
    say(error.message, true);
  }
  await refresh();
  document.body.dataset.ready = "1";
})();
