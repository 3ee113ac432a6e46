// The playground of `ldlm serve`: a text with <|mask|> gaps (or a prompt to continue)
// goes to POST /infill (or /generate) with "stream": true, and the text is redrawn at
// every solver step from the server-sent events. EventSource cannot POST, so the
// stream is read with fetch and a ReadableStream; aborting the fetch closes the
// connection, which is how the server learns to cancel the request.
"use strict";

const MASK = "<|mask|>";
const $ = (id) => document.getElementById(id);

// The API key stays in its password field: never in storage, a cookie or the URL.
function headers(json) {
  const h = json ? { "Content-Type": "application/json" } : {};
  const key = $("api-key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

// "HTTP 400: ..." from the server's {"error": {"message", "field"}} body, or its raw text.
async function errorOf(response) {
  const text = await response.text();
  try {
    const error = JSON.parse(text).error;
    if (error && error.message) return `HTTP ${response.status}: ${error.message}`;
  } catch (_) { /* not JSON: the raw text below */ }
  return `HTTP ${response.status}: ${text.trim() || response.statusText}`;
}

function fillSelect(select, names) {
  const chosen = select.value;
  select.replaceChildren(new Option("default", ""));
  for (const name of names || []) select.add(new Option(name, name));
  select.value = names && names.includes(chosen) ? chosen : "";
}

// The choices and limits of the served model, from GET /v1/models.
async function loadModels() {
  try {
    const response = await fetch("v1/models", { headers: headers(false) });
    if (!response.ok) {
      const hint = response.status === 401 ? " (enter the server's API key below)" : "";
      $("model").textContent = "The model list is unavailable: " + (await errorOf(response)) + hint;
      if (response.status === 401) $("key-field").open = true;
      return;
    }
    const model = (await response.json()).data[0];
    const info = model.ldlm || {};
    fillSelect($("sampler"), info.samplers);
    fillSelect($("schedule"), info.schedules);
    if (info.default_steps) $("steps").placeholder = info.default_steps;
    if (info.max_steps) $("steps").max = info.max_steps;
    if (info.max_batch) $("n").max = info.max_batch;
    if (info.max_length) $("length").max = info.max_length;
    $("model").textContent = `Model: ${model.id}` + (info.max_positions ? `, up to ${info.max_positions} positions` : "");
  } catch (error) {
    $("model").textContent = "The model list is unavailable: " + error.message;
  }
}

function mode() {
  return $("mode-generate").checked ? "generate" : "infill";
}

function showMode() {
  const generate = mode() === "generate";
  $("label-infill").hidden = generate;
  $("label-generate").hidden = !generate;
  $("insert-mask").disabled = generate;
  $("length-field").hidden = !generate;
}

function insertMask() {
  const area = $("text");
  const start = area.selectionStart, end = area.selectionEnd;
  area.setRangeText(MASK, start, end, "end");
  area.focus();
}

// The known text around the gaps: the output keeps it as given, so what lies between
// two known pieces is a gap's sampled text. A space right before a marker belongs to
// the masked token (docs/library.md), so it leaves the piece before.
function knownPieces(text, mode) {
  if (mode === "generate") return [text, ""];
  const pieces = text.split(MASK);
  return pieces.map((piece, i) => (i < pieces.length - 1 && piece.endsWith(" ") ? piece.slice(0, -1) : piece));
}

// [[text, isGap], ...] of an output, or null when the known pieces are not where
// they should be (then the text is shown without highlights). Adjacent gaps, with an
// empty piece between them, come out as one.
function segments(output, pieces) {
  if (!output.startsWith(pieces[0])) return null;
  const parts = pieces[0] ? [[pieces[0], false]] : [];
  let at = pieces[0].length;
  for (let i = 1; i < pieces.length; i++) {
    const piece = pieces[i], last = i === pieces.length - 1;
    const next = last ? output.length - piece.length : output.indexOf(piece, at);
    if (next < at || (last && !output.endsWith(piece))) return null;
    if (next > at) parts.push([output.slice(at, next), true]);
    if (piece) parts.push([piece, false]);
    at = next + piece.length;
  }
  return parts;
}

// `text` into `parent`, each gap in a <mark class="gap"> (plus `gapClass`).
function appendSegments(parent, text, pieces, gapClass) {
  for (const [part, gap] of segments(text, pieces) || [[text, false]]) {
    if (!gap) { parent.append(part); continue; }
    const mark = document.createElement("mark");
    mark.className = "gap " + gapClass;
    mark.textContent = part;
    parent.append(mark);
  }
}

function render(texts, pieces, final) {
  const blocks = texts.map((text) => {
    const block = document.createElement("pre");
    block.className = final ? "sample final" : "sample";
    appendSegments(block, text, pieces, final ? "filled" : "");
    return block;
  });
  $("output").replaceChildren(...blocks);
}

// Server-sent events from a fetch body: yields each event's data (its "data:" lines
// joined), whatever the chunk boundaries.
async function* events(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
    const blocks = buffer.replace(/\r\n?/g, "\n").split("\n\n");
    buffer = done ? "" : blocks.pop();
    for (const block of blocks) {
      const data = block.split("\n").filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(line.startsWith("data: ") ? 6 : 5));
      if (data.length) yield data.join("\n");
    }
    if (done) return;
  }
}

let running = null;  // the AbortController of the request under way
const stepsText = (count) => `${count} step${count === 1 ? "" : "s"}`;
let pendingStep = null, drawTimer = 0, lastDraw = -Infinity;  // the latest step not drawn yet, and when one was

// Steps can arrive faster than a screen refreshes: a step is drawn at once when the last
// drawing is 1/30 s old, else the latest one is drawn when it is, so the page stays
// responsive (and Stop is clicked at once) during long runs.
function drawStep(event, pieces) {
  pendingStep = { event, pieces };
  const wait = lastDraw + 1000 / 30 - performance.now();
  if (wait <= 0) drawPendingStep();
  else if (!drawTimer) drawTimer = setTimeout(drawPendingStep, wait);
}

function drawPendingStep() {
  drawTimer = 0;
  if (!pendingStep) return;  // the run ended first
  const { event, pieces } = pendingStep;
  pendingStep = null;
  lastDraw = performance.now();
  $("progress").max = event.steps;
  $("progress").value = event.step;
  $("status").textContent = `Step ${event.step}/${event.steps}, t = ${event.t.toFixed(3)}`;
  render(event.texts, pieces, false);
}

function forgetPendingStep() {
  clearTimeout(drawTimer);
  drawTimer = 0;
  pendingStep = null;
  lastDraw = -Infinity;
}

function requestOf(currentMode) {
  const number = (id) => Number($(id).value);
  const body = { n: number("n"), seed: number("seed"), stream: true };
  if ($("steps").value) body.steps = number("steps");
  if ($("sampler").value) body.sampler = $("sampler").value;
  if ($("schedule").value) body.schedule = $("schedule").value;
  if (currentMode === "generate") {
    body.prompt = $("text").value;
    body.length = number("length");
  } else {
    body.text = $("text").value;
  }
  return body;
}

function addHistory(event, pieces) {
  const item = document.createElement("li");
  item.append(`step ${event.step}/${event.steps}, t = ${event.t.toFixed(3)}:`);
  event.texts.forEach((text, i) => {
    item.append(i ? "  |  " : " ");
    appendSegments(item, text, pieces, "");
  });
  $("history-list").append(item);
}

async function run(submit) {
  submit.preventDefault();
  if (running || !$("form").reportValidity()) return;
  const currentMode = mode();
  const pieces = knownPieces($("text").value, currentMode);
  showError("");
  $("output").replaceChildren();
  $("history-list").replaceChildren();
  $("progress").value = 0;
  $("status").textContent = "Sending…";
  $("run").disabled = true;
  $("stop").disabled = false;
  running = new AbortController();
  const started = performance.now();
  let steps = 0, finished = false;
  try {
    const response = await fetch(currentMode, {
      method: "POST", headers: headers(true), body: JSON.stringify(requestOf(currentMode)), signal: running.signal,
    });
    if (!response.ok) throw new Error(await errorOf(response));
    for await (const data of events(response.body)) {
      if (data === "[DONE]") break;
      const event = JSON.parse(data);
      if (event.error) throw new Error(event.error.message);
      if (event.object === "ldlm.step") {
        steps++;
        drawStep(event, pieces);
        addHistory(event, pieces);
      } else if (event.texts) {
        forgetPendingStep();
        $("progress").value = $("progress").max;
        render(event.texts, pieces, true);
        finished = true;
      }
    }
    if (!finished) throw new Error("the stream ended before the final text");
    const seconds = ((performance.now() - started) / 1000).toFixed(2);
    $("status").textContent = `Done: ${stepsText(steps)} streamed in ${seconds} s.`;
  } catch (error) {
    if (error.name === "AbortError") {
      $("status").textContent = `Stopped after ${stepsText(steps)}.`;
    } else {
      $("status").textContent = "Failed.";
      showError(error.message);
    }
  } finally {
    running = null;
    forgetPendingStep();
    $("run").disabled = false;
    $("stop").disabled = true;
  }
}

$("form").addEventListener("submit", run);
$("stop").addEventListener("click", () => running && running.abort());
$("insert-mask").addEventListener("click", insertMask);
$("mode-infill").addEventListener("change", showMode);
$("mode-generate").addEventListener("change", showMode);
$("api-key").addEventListener("change", loadModels);
$("text").addEventListener("keydown", (key) => {
  if (key.key === "Enter" && (key.ctrlKey || key.metaKey)) $("form").requestSubmit();
});
showMode();
loadModels();
