// Form behaviour that would otherwise need inline handlers (hx-on), which the
// Content-Security-Policy forbids. Delegated from the document, so forms swapped in by
// htmx work too; without JavaScript the forms post as plain forms.
(function () {
  "use strict";

  // An element marked data-wait-for-form starts no request while its form's own request
  // is in flight: the claim form's inline check must neither abort the save (they share
  // the form's hx-sync queue) nor paint stale errors over its answer.
  document.addEventListener("htmx:confirm", function (event) {
    var element = event.target;
    if (!element.hasAttribute || !element.hasAttribute("data-wait-for-form")) { return; }
    var form = element.closest("form");
    if (form && form.classList.contains("htmx-request")) { event.preventDefault(); }
  });
})();
