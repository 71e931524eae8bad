// berth dashboard: live overview and page selection. No framework; all
// text goes in through textContent, never as HTML, and only numbers: names
// are shown by the server, which escapes them (a new queue reloads the page).
"use strict";

// rowName is the name of the queue of an overview row as the API gives it:
// data-name holds it as a JSON string (data-queue, the name as it is, can
// differ: an HTML parser reads a carriage return as a line feed, and a NUL
// or bytes that are not UTF-8 come out otherwise than from JSON); null for
// a row that is not a queue's.
function rowName(row) {
  if (row.dataset.name === undefined) return null;
  try {
    return JSON.parse(row.dataset.name);
  } catch (e) {
    return null;
  }
}

// refreshQueues updates the overview's table from the API. A refresh still
// waiting on the server (a broker that does not answer: the server gives up
// after its -request-timeout) is not joined by another: the ticks that come
// meanwhile are skipped and counted (data-skipped), so that refreshes do not
// pile up and take every connection the browser has to the dashboard.
function refreshQueues(table) {
  if (table.dataset.pending === "1") {
    table.dataset.skipped = String(Number(table.dataset.skipped || 0) + 1);
    const note = document.getElementById("refreshed");
    if (note) note.textContent = "Waiting for the broker: the counts shown may be out of date.";
    return;
  }
  table.dataset.pending = "1";
  fetch(table.dataset.live, { headers: { Accept: "application/json" }, credentials: "same-origin" })
    .then((r) => (r.ok ? r.json() : Promise.reject(r.status)))
    .then((data) => {
      const body = table.tBodies[0];
      const seen = new Set();
      for (const q of data.queues) {
        seen.add(q.queue);
        const row = Array.from(body.rows).find((r) => rowName(r) === q.queue);
        if (!row) {
          // A queue the page does not show yet: reload it, so that its name
          // is shown as the server shows text (control, bidirectional and
          // invisible characters as escapes), not as it is.
          location.reload();
          return;
        }
        for (const c of ["ready", "delayed", "in_flight", "dead_lettered", "oldest_age"]) {
          const cell = row.querySelector("td." + c);
          const v = String(q[c]);
          if (cell.textContent === v) continue;
          if (c === "dead_lettered" && q[c] > 0) { // a link to the dead letters
            const a = document.createElement("a");
            a.href = "/queues/" + encodeURIComponent(q.queue);
            a.textContent = v;
            cell.replaceChildren(a);
          } else {
            cell.textContent = v;
          }
        }
      }
      for (const row of Array.from(body.rows)) {
        const name = rowName(row);
        if (name !== null && !seen.has(name)) row.remove();
      }
      const note = document.getElementById("refreshed");
      if (note) note.textContent = "Updated " + new Date().toLocaleTimeString() + "; refreshes every 2 s.";
      table.dataset.refreshes = String(Number(table.dataset.refreshes || 0) + 1);
    })
    .catch(() => {
      const note = document.getElementById("refreshed");
      if (note) note.textContent = "Refresh failed; retrying.";
    })
    .finally(() => {
      table.dataset.pending = "";
    });
}

document.addEventListener("DOMContentLoaded", () => {
  const live = document.querySelector("table[data-live]");
  if (live) setInterval(() => refreshQueues(live), 2000);

  const pageAll = document.getElementById("page-all");
  if (pageAll) {
    pageAll.addEventListener("change", () => {
      for (const box of document.querySelectorAll('#dead-letters input[name="id"], #dead-letters input[name="id64"]')) box.checked = pageAll.checked;
    });
  }
  const all = document.getElementById("all");
  if (all) {
    all.addEventListener("change", () => {
      for (const box of document.querySelectorAll('#dead-letters input[name="id"], #dead-letters input[name="id64"]')) {
        box.checked = all.checked;
        box.disabled = all.checked;
      }
    });
  }
});
