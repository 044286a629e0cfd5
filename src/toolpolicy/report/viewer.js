// The trajectory viewer of report.html: reads the JSON in #viewer-data (report/viewer.py
// documents its fields) and draws the reward curve, the episode list, the tokens and the
// group columns. Plain DOM, no library: the page must open offline.
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("viewer-data").textContent);
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";
  const state = { stepIndex: data.steps.length - 1, episode: null, view: "episode" };

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function svgElement(tag, attributes) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
    return node;
  }

  const fixed = (x) => (x === null || x === undefined ? "n/a" : x.toFixed(5));
  const advantageOf = (e, k) => (typeof e.adv === "number" ? e.adv : e.adv[k]);
  const denials = (e) => e.events.filter((ev) => ev[0] === "gate_deny").length;
  const currentStep = () => data.steps[state.stepIndex];

  // sampledIndex[i]: the position of token i among the sampled tokens, or -1.
  function sampledIndex(e) {
    const index = new Array(e.ids.length).fill(-1);
    let k = 0;
    for (const [start, end] of e.sampled) for (let i = start; i < end; i++) index[i] = k++;
    return index;
  }

  function largestAdvantage(step) {
    let largest = 0;
    for (const e of step.episodes) {
      const values = typeof e.adv === "number" ? [e.adv] : e.adv;
      for (const a of values) largest = Math.max(largest, Math.abs(a));
    }
    return largest;
  }

  // Green above zero, red below, more opaque the larger |advantage| is against the step's largest.
  function advantageColour(advantage, largest) {
    const strength = largest > 0 ? Math.min(1, Math.abs(advantage) / largest) : 0;
    const alpha = (0.15 + 0.6 * strength).toFixed(2);
    if (advantage > 0) return `rgba(26, 127, 55, ${alpha})`;
    if (advantage < 0) return `rgba(193, 18, 31, ${alpha})`;
    return "rgba(120, 120, 120, 0.25)";
  }

  // ---- the reward curve: one point a step, the embedded ones clickable ----
  function drawCurve() {
    const svg = $("viewer-curve");
    const embedded = new Set(data.steps.map((s) => s.step));
    let points = data.rewards;
    if (!points.length) {  // no metrics.jsonl: the embedded episodes' mean reward
      points = data.steps.map((s) => [s.step, s.episodes.reduce((sum, e) => sum + e.reward, 0) / Math.max(1, s.episodes.length)]);
    }
    const width = 1000, height = 150, left = 48, right = 12, top = 12, bottom = 28;
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    const steps = points.map((p) => p[0]), rewards = points.map((p) => p[1]);
    const [x0, x1] = [Math.min(...steps), Math.max(...steps)];
    let [y0, y1] = [Math.min(...rewards), Math.max(...rewards)];
    if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
    const x = (step) => left + (x1 === x0 ? 0.5 : (step - x0) / (x1 - x0)) * (width - left - right);
    const y = (reward) => top + (1 - (reward - y0) / (y1 - y0)) * (height - top - bottom);
    svg.append(svgElement("polyline", { points: points.map((p) => `${x(p[0])},${y(p[1])}`).join(" "), class: "curve-line" }));
    for (const [value, anchor] of [[y1, "top"], [y0, "bottom"]]) {
      const label = svgElement("text", { x: left - 6, y: y(value) + (anchor === "top" ? 4 : 0), class: "curve-axis", "text-anchor": "end" });
      label.textContent = value.toFixed(2);
      svg.append(label);
    }
    const caption = svgElement("text", { x: (left + width) / 2, y: height - 6, class: "curve-axis", "text-anchor": "middle" });
    caption.textContent = `mean reward per RL step (steps ${x0}..${x1}; filled points have their rollouts on this page)`;
    svg.append(caption);
    for (const [step, reward] of points) {
      const inPage = embedded.has(step);
      const point = svgElement("circle", { cx: x(step), cy: y(reward), r: inPage ? 5 : 3, class: inPage ? "curve-point embedded" : "curve-point", "data-step": step });
      const title = svgElement("title", {});
      title.textContent = `step ${step}: reward ${reward.toFixed(3)}${inPage ? " (click for its rollouts)" : " (rollouts not embedded)"}`;
      point.append(title);
      if (inPage) {
        point.setAttribute("tabindex", "0");
        point.setAttribute("role", "button");
        const open = () => { selectStep(data.steps.findIndex((s) => s.step === step)); $("viewer").scrollIntoView(); };
        point.addEventListener("click", open);
        point.addEventListener("keydown", (event) => { if (event.key === "Enter" || event.key === " ") open(); });
      }
      svg.append(point);
    }
  }

  function markCurve() {
    for (const point of $("viewer-curve").querySelectorAll("circle"))
      point.classList.toggle("selected", Number(point.dataset.step) === currentStep().step);
  }

  // ---- the episode list and its filters ----
  function bound(id) {
    const text = $(id).value.trim();
    return text === "" ? null : Number(text);
  }

  function filtered() {
    const low = bound("viewer-reward-min"), high = bound("viewer-reward-max");
    return currentStep().episodes.filter((e) =>
      (low === null || e.reward >= low) && (high === null || e.reward <= high) &&
      (!$("viewer-denied").checked || denials(e) > 0) && (!$("viewer-truncated").checked || e.truncated));
  }

  function drawList() {
    if (!data.steps.length) return;
    const shown = filtered(), step = currentStep();
    if (!shown.includes(state.episode)) state.episode = shown[0] || null;
    const body = $("viewer-list").tBodies[0];
    body.replaceChildren();
    for (const e of shown) {
      const row = element("tr");
      for (const cell of [e.episode, e.group, e.task, e.reward.toFixed(3), e.ids.length, denials(e) || "", e.truncated ? "yes" : ""])
        row.append(element("td", "", String(cell)));
      row.dataset.episode = e.episode;
      row.tabIndex = 0;
      row.classList.toggle("selected", e === state.episode);
      row.addEventListener("click", () => selectEpisode(e));
      row.addEventListener("keydown", (event) => { if (event.key === "Enter") selectEpisode(e); });
      body.append(row);
    }
    $("viewer-count").textContent = `${shown.length} of ${step.episodes.length} embedded episodes (step ${step.step} stored ${step.stored})`;
    drawDetail();
  }

  // ---- one episode: summary, tokens, each turn's events ----
  function summary(e) {
    const parts = [`episode ${e.episode}`, `group ${e.group}`, `task ${e.task}`, `reward ${e.reward.toFixed(3)}`];
    parts.push(...Object.entries(e.components).map(([name, value]) => `${name} ${value.toFixed(2)}`));
    parts.push(`${e.ids.length} tokens (${e.lp.length} sampled)`, e.kept ? "trained" : "not trained", `staleness ${e.staleness}`);
    if (e.gap) parts.push(`max |log-prob gap| ${Math.max(0, ...e.gap.map(Math.abs)).toPrecision(3)}`);
    if (e.truncated) parts.push("TRUNCATED");
    if (e.infra_error) parts.push(`infra error: ${e.infra_error}`);
    return parts.join(" · ");
  }

  // An event as a badge: [css class, label, what its detail is]. Others show their kind.
  const EVENT_BADGES = {
    gate_deny: ["bad", "gate: denied", "rules "],
    violation: ["bad", "gate (shadow): would deny", "rules "],
    tool_call: ["call", "gate: allowed, ran", ""],
    invalid_call: ["warn", "invalid call", ""],
    truncated: ["trunc", "truncated", ""],
  };

  function eventsBlock(events) {
    const block = element("div", "turn-events");
    for (const [kind, , detail] of events) {
      const [css, label, prefix] = EVENT_BADGES[kind] || ["warn", kind, ""];
      const badge = element("span", `badge ${css}`, label);
      if (detail) badge.append(element("span", "detail", ` ${prefix}${detail}`));
      block.append(badge);
    }
    return block;
  }

  // The episode's tokens from `first` on (the group view starts after the prompt, the same in every column).
  function tokensOf(e, largest, first = 0) {
    const box = element("div", "tokens");
    if (first > 0) box.append(element("div", "muted", `[prompt: ${first} tokens, shown in the episode view]`));
    const index = sampledIndex(e);
    const eventsByTurn = new Map();
    for (const ev of e.events) eventsByTurn.set(ev[1], [...(eventsByTurn.get(ev[1]) || []), ev]);
    const turnEndingAt = new Map(e.turns.map(([, end], turn) => [end, turn]));
    const pictureAt = new Map((e.images || []).map(([start, source]) => [start, source]));
    let inPicture = -1;  // the placeholder id of the picture being skipped, or -1
    const flushTurn = (turn) => {
      if (eventsByTurn.has(turn)) { box.append(eventsBlock(eventsByTurn.get(turn))); eventsByTurn.delete(turn); }
    };
    e.ids.forEach((id, i) => {
      if (i < first) return;
      if (turnEndingAt.has(i)) flushTurn(turnEndingAt.get(i));
      if (pictureAt.has(i)) {  // the picture in place of its run of placeholders
        const picture = element("img", "picture");
        picture.src = pictureAt.get(i);
        picture.alt = `picture at token ${i}`;
        box.append(picture);
        inPicture = id;
        return;
      }
      if (inPicture === id) return;
      inPicture = -1;
      const k = index[i];
      const kind = k >= 0 ? "sampled" : i < e.prompt_len ? "prompt" : "observation";
      const token = element("span", `tok ${kind}`, data.vocab[id]);
      token.dataset.i = i;
      if (k >= 0) {
        token.style.background = advantageColour(advantageOf(e, k), largest);
        token.tabIndex = 0;
      }
      box.append(token);
    });
    [...eventsByTurn.keys()].sort((a, b) => a - b).forEach(flushTurn);  // the last turn's, and later ones
    box.episode = e;
    return box;
  }

  function legend() {
    const line = element("div", "viewer-legend");
    for (const [css, text] of [["tok prompt", "prompt"], ["tok observation", "tool / user / gate"], ["tok sampled positive", "sampled, advantage > 0"], ["tok sampled negative", "advantage < 0"]])
      line.append(element("span", css, text));
    return line;
  }

  function drawDetail() {
    const box = $("viewer-episode"), e = state.episode, step = currentStep();
    box.replaceChildren();
    for (const row of $("viewer-list").tBodies[0].rows) row.classList.toggle("selected", e !== null && Number(row.dataset.episode) === e.episode);
    if (e === null) { box.append(element("p", "na", "No episode matches the filters.")); return; }
    const largest = largestAdvantage(step);
    if (state.view === "episode") {
      box.append(element("div", "viewer-summary", summary(e)), legend(), tokensOf(e, largest));
      return;
    }
    const members = step.episodes.filter((m) => m.group === e.group);
    box.append(element("div", "viewer-summary", `group ${e.group} (task ${e.task}) at step ${step.step}: ${members.length} episodes side by side`), legend());
    const columns = element("div", "group-columns");
    for (const m of members) {
      const column = element("div", m === e ? "group-column selected" : "group-column");
      column.append(element("div", "group-head", `ep ${m.episode} · reward ${m.reward.toFixed(3)}${m.truncated ? " · truncated" : ""}${denials(m) ? ` · ${denials(m)} denied` : ""}`), tokensOf(m, largest, m.prompt_len));
      columns.append(column);
    }
    box.append(columns);
  }

  // ---- the tooltip: one token's numbers ----
  function tooltipLines(e, i) {
    const k = sampledIndex(e)[i];
    const lines = [`token ${i} · id ${e.ids[i]} · ${JSON.stringify(data.vocab[e.ids[i]])}`];
    if (k < 0) {
      lines.push(i < e.prompt_len ? "prompt: not sampled, not trained" : "tool / user / gate text: not sampled, not trained");
      return lines;
    }
    lines.push(`sampled log-prob ${fixed(e.lp[k])}`);
    lines.push(e.tlp ? `trainer log-prob ${fixed(e.tlp[k])}` : "trainer log-prob n/a (episode not trained)");
    if (e.gap) lines.push(`difference (trainer - sampled) ${e.gap[k] === 0 ? "0" : e.gap[k].toPrecision(3)}`);
    lines.push(`advantage ${fixed(advantageOf(e, k))}`);
    return lines;
  }

  function showTooltip(token) {
    const tip = $("viewer-tooltip");
    const lines = tooltipLines(token.parentElement.episode, Number(token.dataset.i));
    tip.replaceChildren(...lines.map((line) => element("div", "", line)));
    const box = token.getBoundingClientRect();
    tip.hidden = false;
    tip.style.left = `${window.scrollX + Math.min(box.left, window.innerWidth - tip.offsetWidth - 8)}px`;
    tip.style.top = `${window.scrollY + box.bottom + 4}px`;
  }

  function hideTooltip() { $("viewer-tooltip").hidden = true; }

  // ---- selection ----
  function selectStep(index) {
    state.stepIndex = index;
    state.episode = null;
    $("viewer-step").value = String(index);
    markCurve();
    drawList();
  }

  function selectEpisode(e) {
    state.episode = e;
    drawDetail();
  }

  function selectView(view) {
    state.view = view;
    $("viewer-tab-episode").setAttribute("aria-pressed", String(view === "episode"));
    $("viewer-tab-group").setAttribute("aria-pressed", String(view === "group"));
    drawDetail();
  }

  data.steps.forEach((s, index) => {
    const option = element("option", "", `${s.step} (${s.episodes.length} of ${s.stored} episodes)`);
    option.value = String(index);
    $("viewer-step").append(option);
  });
  $("viewer-step").addEventListener("change", (event) => selectStep(Number(event.target.value)));
  for (const id of ["viewer-reward-min", "viewer-reward-max", "viewer-denied", "viewer-truncated"])
    $(id).addEventListener("input", drawList);
  $("viewer-tab-episode").addEventListener("click", () => selectView("episode"));
  $("viewer-tab-group").addEventListener("click", () => selectView("group"));
  const detail = $("viewer-episode");
  for (const type of ["mouseover", "focusin"])
    detail.addEventListener(type, (event) => { if (event.target.classList.contains("tok")) showTooltip(event.target); });
  for (const type of ["mouseout", "focusout"]) detail.addEventListener(type, hideTooltip);
  drawCurve();
  if (data.steps.length) selectStep(state.stepIndex);
})();
