// toolspan viewer: the only script on its pages (served from /assets, no inline code).
// Shows times in the reader's zone, folds subtrees of the waterfall, applies filters on change.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("time[datetime]").forEach(function (t) {
    var d = new Date(t.getAttribute("datetime"));
    if (!isNaN(d.getTime())) {
      t.title = t.textContent;
      t.textContent = d.toLocaleString(undefined, {
        year: "numeric", month: "2-digit", day: "2-digit",
        hour: "2-digit", minute: "2-digit", second: "2-digit", fractionalSecondDigits: 3
      });
    }
  });
  document.querySelectorAll("form.filters select").forEach(function (s) {
    s.addEventListener("change", function () { s.form.submit(); });
  });
  document.querySelectorAll("button.fold").forEach(function (b) {
    b.addEventListener("click", function (e) {
      e.preventDefault();
      var row = b.closest("tr");
      var depth = Number(row.getAttribute("data-depth"));
      var open = b.getAttribute("aria-expanded") !== "false";
      b.setAttribute("aria-expanded", open ? "false" : "true");
      b.textContent = open ? "▸" : "▾";
      for (var r = row.nextElementSibling; r; r = r.nextElementSibling) {
        if (Number(r.getAttribute("data-depth")) <= depth) break;
        r.hidden = open;
      }
    });
  });
});
