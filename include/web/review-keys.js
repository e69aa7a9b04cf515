// The keys of the one-at-a-time review page (triage.web.review_next): 1-9 give a label, r requeues,
// x rejects, s skips. Each key clicks the element that shows it (data-key), so the key does exactly
// what the button or link does, through the same form. Typing a note is left alone; Esc leaves it.
(function () {
  "use strict";
  var KEYS = /^[1-9rxs]$/;
  var sent = false; // one decision per page: a held or repeated key must not send a second
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || event.isComposing) {
      return;
    }
    var target = event.target;
    var typing = target && (target.isContentEditable || /^(TEXTAREA|INPUT|SELECT)$/.test(target.tagName));
    if (typing) {
      if (event.key === "Escape") {
        target.blur();
      }
      return;
    }
    var key = (event.key || "").toLowerCase();
    if (sent || !KEYS.test(key)) {
      return;
    }
    var element = document.querySelector('[data-key="' + key + '"]');
    if (!element) {
      return;
    }
    event.preventDefault();
    sent = true;
    element.click();
  });
})();
