// Sortable tables: click (or Enter on) a header to sort its column, again to reverse. Cells carry the
// value they sort by in data-sort (a number for number columns); empty values always sort last.
// Text sorts naturally and the same in every browser and locale: case-folded, digit runs compared as
// numbers (so "p=0.9" comes before "p=0.99" and "k=4" before "k=16"), other runs by code unit.
"use strict";
function naturalCompare(x, y) {
  const a = x.toLowerCase().match(/\d+|\D+/g) || [], b = y.toLowerCase().match(/\d+|\D+/g) || [];
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    const digits = /^\d/.test(a[i]) && /^\d/.test(b[i]);
    const d = digits ? parseInt(a[i], 10) - parseInt(b[i], 10) : (a[i] < b[i] ? -1 : a[i] > b[i] ? 1 : 0);
    if (d !== 0) return d;
  }
  return a.length - b.length || (x < y ? -1 : x > y ? 1 : 0);
}
function sortTable(th) {
  const table = th.closest("table");
  const headers = Array.from(th.parentNode.children);
  const col = headers.indexOf(th);
  const ascending = th.getAttribute("aria-sort") !== "ascending";
  const numeric = th.dataset.type === "number";
  const body = table.tBodies[0];
  const rows = Array.from(body.rows);
  const key = (row) => row.cells[col].dataset.sort;
  rows.sort((a, b) => {
    const x = key(a), y = key(b);
    if (x === "" || y === "") return (x === "") - (y === "");
    let d;
    if (numeric && !isNaN(parseFloat(x)) && !isNaN(parseFloat(y))) d = parseFloat(x) - parseFloat(y);
    else d = naturalCompare(x, y);
    return ascending ? d : -d;
  });
  rows.forEach((row) => body.appendChild(row));
  headers.forEach((h) => h.removeAttribute("aria-sort"));
  th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
  stickColumns();
}
// table.sticky keeps its first two columns in view (site.css): the second sticks where the first ends.
function stickColumns() {
  document.querySelectorAll("table.sticky").forEach((table) => {
    const first = table.querySelector("tr > :first-child");
    if (first) table.style.setProperty("--sticky-second", `${first.getBoundingClientRect().width}px`);
  });
}
window.addEventListener("resize", stickColumns);
document.addEventListener("DOMContentLoaded", () => {
  stickColumns();
  document.querySelectorAll("table.sortable th").forEach((th) => {
    th.addEventListener("click", () => sortTable(th));
    th.addEventListener("keydown", (e) => { if (e.key === "Enter") sortTable(th); });
  });
});
