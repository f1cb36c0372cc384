// A little plain JavaScript: no double submission, and refresh while a background job runs.
"use strict";
document.querySelectorAll("form[data-once]").forEach(function (form) {
  form.addEventListener("submit", function () {
    // Disable after the browser has captured the clicked button's name/value.
    setTimeout(function () {
      form.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
    }, 0);
  });
});
var job = document.getElementById("job");
if (job && job.dataset.state === "running") {
  setTimeout(function () { window.location.replace(window.location.pathname); }, 2000);
}
var resumption = document.getElementById("resumption");
if (resumption && /^Agent run: (queued|resuming)/.test(resumption.textContent)) {
  setTimeout(function () { window.location.replace(window.location.pathname); }, 2000);
}
