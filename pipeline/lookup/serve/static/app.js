// The sense explorer: talks to the same HTTP API a program would (docs/serving.md).
"use strict";

const $ = (id) => document.getElementById(id);
const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                 "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
let current = { sentence: "", tokens: [] };

function status(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

async function call(path, body) {
  const options = body === undefined ? {} : {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  };
  const response = await fetch(path, options);
  const data = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}

// Text with [start, end) marked; every piece goes in as text, never as HTML.
function marked(text, start, end) {
  const out = document.createElement("span");
  out.append(text.slice(0, start));
  const mark = document.createElement("mark");
  mark.textContent = text.slice(start, end);
  out.append(mark, text.slice(end));
  return out;
}

function escapeHtml(text) {
  return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

// The filter box holds `elmo senses search --where` conditions, comma-separated:
// year>=1900, year=1900..1950, party=A|B, source~moby (contains, any case).
function parseWhere() {
  return $("filters").value.split(",").map((part) => part.trim()).filter((part) => part);
}

async function loadInfo() {
  const info = await call("/info");
  for (const ix of info.indexes) {
    const option = new Option(`${ix.name} (${ix.mix}, ${ix.rows} rows)`, ix.name);
    $("index").append(option);
  }
  $("fields").textContent = "document fields for filters: " +
    info.dataset.document_fields.join(", ");
  for (const name of info.dataset.document_fields) {
    if (name !== "doc_id" && name !== "line") $("by").append(new Option(name, name));
  }
}

// The filter box's conditions as repeated `where` query parameters.
function whereQuery() {
  return parseWhere().map((w) => `&where=${encodeURIComponent(w)}`).join("");
}

async function showWords(event) {
  event.preventDefault();
  const sentence = $("sentence").value.trim();
  if (!sentence) { status("type a sentence first", true); return; }
  status("splitting the sentence…");
  try {
    const data = await call("/embed", { sentences: [sentence], mix: "top" });
    current = { sentence, tokens: data.sentences[0].tokens };
    const box = $("tokens");
    box.replaceChildren();
    current.tokens.forEach((token, i) => {
      const button = document.createElement("button");
      button.type = "button";
      button.className = "token";
      button.textContent = token;
      button.dataset.position = i;
      button.addEventListener("click", () => chooseWord(i));
      box.append(button);
    });
    status("click a word");
  } catch (error) { status(error.message, true); }
}

async function chooseWord(position) {
  document.querySelectorAll(".token").forEach((b) =>
    b.classList.toggle("chosen", Number(b.dataset.position) === position));
  const word = current.tokens[position];
  // Which use of this exact token the click was: the server counts them the same way.
  const occurrence = current.tokens.slice(0, position + 1).filter((t) => t === word).length;
  const index = $("index").value || null;
  status(`searching uses of “${word}”…`);
  try {
    const data = await call("/senses/search", {
      sentence: current.sentence, word, occurrence, k: Number($("k").value) || 10,
      any_word: $("any-word").checked, where: parseWhere(), index,
    });
    showHits(data.hits);
    status(`${data.hits.length} nearest uses of “${word}”; click one to read it in context`);
  } catch (error) { status(error.message, true); return; }
  showSenses(word, index);
  showOverTime(word, index);
}

function showHits(hits) {
  const list = $("results");
  list.replaceChildren();
  for (const hit of hits) {
    const item = document.createElement("li");
    item.className = "hit";
    const meta = document.createElement("div");
    meta.className = "meta";
    const sim = document.createElement("span");
    sim.className = "sim";
    sim.textContent = hit.similarity.toFixed(3);
    // doc_id names the file and line; the document's metadata (year, president, ...) follows.
    const fields = Object.entries(hit.document)
      .filter(([name, value]) => name !== "source" && name !== "line" && value !== null)
      .map(([name, value]) => `${name}=${value}`).join(" ");
    meta.append(sim, `  ${hit.doc_id} #${hit.sent_idx}.${hit.tok_idx}  ${fields}`);
    item.append(marked(hit.sentence, hit.start, hit.end), meta);
    item.addEventListener("click", () => showContext(hit));
    list.append(item);
  }
}

async function showContext(hit) {
  try {
    const path = `/sentences/${encodeURIComponent(hit.doc_id)}/${hit.sent_idx}?context=2`;
    const data = await call(path);
    $("context-title").textContent = `${hit.doc_id}, sentence ${hit.sent_idx}`;
    const text = $("context-text");
    text.replaceChildren();
    for (const s of data.sentences) {
      const p = document.createElement("p");
      if (s.sent_idx === hit.sent_idx) {
        p.className = "focus";
        p.append(marked(s.text, hit.start, hit.end));
      } else {
        p.textContent = s.text;
      }
      text.append(p);
    }
    $("context").hidden = false;
  } catch (error) { status(error.message, true); }
}

async function showSenses(word, index) {
  const names = $("sense-names");
  names.replaceChildren();
  try {
    // The map shows the uses the filter box keeps, as the nearest uses do.
    const query = `?k=auto${index ? `&index=${encodeURIComponent(index)}` : ""}${whereQuery()}`;
    const data = await call(`/senses/${encodeURIComponent(word.toLowerCase())}${query}`);
    const traces = data.clusters.map((c) => {
      const points = data.points.filter((p) => p.cluster === c.label);
      return {
        type: "scatter", mode: "markers", name: escapeHtml(c.name),
        x: points.map((p) => p.x), y: points.map((p) => p.y),
        marker: { color: COLOURS[c.label % COLOURS.length], size: 7, opacity: 0.8 },
        hovertext: points.map((p) => escapeHtml(p.snippet)
          .replace("\u0002", "<b>").replace("\u0003", "</b>")),
        hoverinfo: "text",
      };
    });
    // The title is the page's, above the plot: inside it, plotly's toolbar covered it.
    $("sense-map-title").textContent = `“${word}”: ${data.distinct} uses, k=${data.k}`;
    Plotly.newPlot("sense-map", traces, {
      margin: { t: 30, l: 30, r: 10, b: 30 }, legend: { orientation: "h" },
    }, { responsive: true, displaylogo: false });
    for (const c of data.clusters) {
      const li = document.createElement("li");
      li.textContent = c.name;
      names.append(li);
    }
  } catch (error) {
    Plotly.purge("sense-map");
    $("sense-map-title").textContent = "";
    const li = document.createElement("li");
    li.textContent = `no sense map: ${error.message}`;
    names.append(li);
  }
}

// A word's senses per group of a document field (`elmo senses change WORD --by F`):
// stacked bars of each sense's share; a group's button lists its uses.
async function showOverTime(word, index) {
  const by = $("by").value;
  $("over-time").hidden = !by;
  if (!by) return;
  const bin = $("bin").value ? `&bin=${encodeURIComponent($("bin").value)}` : "";
  const ix = index ? `&index=${encodeURIComponent(index)}` : "";
  $("groups").replaceChildren();
  $("group-uses").replaceChildren();
  try {
    const data = await call(`/senses/${encodeURIComponent(word.toLowerCase())}/change` +
                            `?by=${encodeURIComponent(by)}${bin}${ix}${whereQuery()}`);
    const groups = data.rows.map((r) => r.value);
    const traces = data.senses.map((name, i) => ({
      type: "bar", name: escapeHtml(name), x: groups,
      y: data.rows.map((r) => (r.total ? r.counts[i] / r.total : 0)),
      customdata: data.rows.map((r) => r.counts[i]),
      marker: { color: COLOURS[i % COLOURS.length] },
      hovertemplate: `sense ${i + 1}: %{customdata} uses (%{y:.0%})<extra></extra>`,
    }));
    const binned = data.bin ? ` (bins of ${data.bin})` : "";
    $("over-time-title").textContent = `Senses of “${word}” by ${by}${binned}`;
    Plotly.newPlot("sense-time", traces, {
      // The legend below the axis title (plotly's default place is on it), margin grown
      // to hold it.
      barmode: "stack", margin: { t: 30, l: 50, r: 10, b: 60 },
      legend: { orientation: "h", x: 0, xanchor: "left", y: -0.3, yanchor: "top" },
      xaxis: { title: { text: `${escapeHtml(by)}${binned}` }, type: "category",
               automargin: true },
      yaxis: { title: { text: "share of the word's uses" }, range: [0, 1] },
    }, { responsive: true, displaylogo: false });
    $("sense-time").on("plotly_click", (event) => listUses(data, event.points[0].x));
    for (const row of data.rows) {
      const button = document.createElement("button");
      button.type = "button";
      button.className = "group";
      button.textContent = `${row.value} (${row.total})`;
      button.dataset.group = row.value;
      button.addEventListener("click", () => listUses(data, row.value));
      $("groups").append(button);
    }
  } catch (error) {
    Plotly.purge("sense-time");
    $("over-time-title").textContent = `no senses per group: ${error.message}`;
  }
}

function listUses(data, group) {
  document.querySelectorAll("#groups .group").forEach((b) =>
    b.classList.toggle("chosen", b.dataset.group === group));
  const list = $("group-uses");
  list.replaceChildren();
  for (const use of data.uses[group] || []) {
    const item = document.createElement("li");
    item.className = "hit";
    const sense = document.createElement("span");
    sense.className = "sense";
    sense.style.color = COLOURS[(use.sense - 1) % COLOURS.length];
    sense.textContent = `sense ${use.sense}`;
    const meta = document.createElement("div");
    meta.className = "meta";
    meta.textContent = `${use.doc_id} #${use.sent_idx}.${use.tok_idx}`;
    item.append(sense, marked(use.sentence, use.start, use.end), meta);
    item.addEventListener("click", () => showContext(use));
    list.append(item);
  }
}

$("query-form").addEventListener("submit", showWords);
$("close-context").addEventListener("click", () => { $("context").hidden = true; });
loadInfo().catch((error) => status(error.message, true));
