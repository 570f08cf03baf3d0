// keyshot report: the trajectory table (sort, filter, pages) and the screenshot viewer. Every string
// from the data goes into the page with textContent, never as HTML.
(function () {
  "use strict";
  var PAGE = 100;

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function table() {
    var data = document.getElementById("rows");
    var body = document.querySelector("#trajectories tbody");
    if (!data || !body) return;
    var rows = JSON.parse(data.textContent);
    var state = { filter: "all", agent: "", q: "", sort: "index", asc: true, page: 0 };
    var hash = new URLSearchParams(location.hash.slice(1));
    if (hash.get("filter")) state.filter = hash.get("filter");
    var filters = {
      all: function () { return true; },
      disagree: function (r) { return r.agree === false; },
      unreadable: function (r) { return r.verdict === "no-status"; },
      incomplete: function (r) { return r.verdict === "incomplete" || r.verdict === "no-scores"; },
      apart: function (r) { return r.kind === "not executable" || r.kind === "infrastructure"; },
    };

    function visible() {
      var f = filters[state.filter] || filters.all;
      var q = state.q.toLowerCase();
      var out = rows.filter(function (r) {
        return f(r) && (!state.agent || r.agent === state.agent) &&
          (!q || (r.task + " " + r.task_id).toLowerCase().indexOf(q) >= 0);
      });
      out.sort(function (a, b) {
        var x = a[state.sort], y = b[state.sort];
        if (x === y) return a.index - b.index;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return (x < y ? -1 : 1) * (state.asc ? 1 : -1);
      });
      return out;
    }

    function render() {
      var shown = visible();
      var pages = Math.max(1, Math.ceil(shown.length / PAGE));
      state.page = Math.min(state.page, pages - 1);
      body.textContent = "";
      shown.slice(state.page * PAGE, (state.page + 1) * PAGE).forEach(function (r) {
        var tr = el("tr", r.agree === false ? "disagree" : "");
        var link = el("a", "", r.task);
        link.href = r.href;
        var task = el("td");
        task.appendChild(link);
        var verdict = el("td");
        verdict.appendChild(el("span", "badge " + r.verdict, r.verdict));
        if (r.judged) verdict.appendChild(el("span", "muted", " judged anyway: " + r.judged));
        var truth = el("td");
        if (r.truth) truth.appendChild(el("span", "badge " + r.truth, r.truth));
        [el("td", "", r.agent), el("td", "", r.task_id), el("td", "", r.run), task, verdict, truth,
         el("td", "", r.agree === null ? "" : (r.agree ? "yes" : "no")),
         el("td", "", r.kind), el("td", "num", r.shots), el("td", "num", r.kept),
         el("td", "num", r.cost ? r.cost.toFixed(4) : "")].forEach(function (td) { tr.appendChild(td); });
        body.appendChild(tr);
      });
      document.getElementById("count").textContent = shown.length + " of " + rows.length + " trajectories";
      document.getElementById("page").textContent = "page " + (state.page + 1) + " of " + pages;
      document.querySelectorAll("[data-filter]").forEach(function (b) {
        b.classList.toggle("on", b.getAttribute("data-filter") === state.filter);
      });
      document.querySelectorAll("#trajectories th[data-key]").forEach(function (th) {
        th.classList.toggle("sorted", th.getAttribute("data-key") === state.sort);
        th.classList.toggle("asc", state.asc);
      });
    }

    document.querySelectorAll("[data-filter]").forEach(function (b) {
      b.addEventListener("click", function () {
        state.filter = b.getAttribute("data-filter");
        state.page = 0;
        history.replaceState(null, "", "#filter=" + state.filter);
        render();
      });
    });
    document.querySelectorAll("#trajectories th[data-key]").forEach(function (th) {
      th.addEventListener("click", function () {
        var key = th.getAttribute("data-key");
        state.asc = state.sort === key ? !state.asc : true;
        state.sort = key;
        render();
      });
    });
    var agent = document.getElementById("agent");
    var agents = Array.from(new Set(rows.map(function (r) { return r.agent; }))).sort();
    agents.forEach(function (a) { var o = el("option", "", a); o.value = a; agent.appendChild(o); });
    agent.addEventListener("change", function () { state.agent = agent.value; state.page = 0; render(); });
    document.getElementById("search").addEventListener("input", function (e) {
      state.q = e.target.value; state.page = 0; render();
    });
    document.getElementById("prev").addEventListener("click", function () { if (state.page > 0) { state.page--; render(); } });
    document.getElementById("next").addEventListener("click", function () { state.page++; render(); });
    render();
  }

  function lightbox() {
    var box = document.getElementById("lightbox");
    if (!box) return;
    var img = box.querySelector("img");
    document.querySelectorAll("a.zoom").forEach(function (a) {
      a.addEventListener("click", function (e) {
        e.preventDefault();
        img.src = a.getAttribute("href");
        box.classList.add("open");
      });
    });
    box.addEventListener("click", function () { box.classList.remove("open"); img.removeAttribute("src"); });
    document.addEventListener("keydown", function (e) { if (e.key === "Escape") box.click(); });
  }

  table();
  lightbox();
})();
