// Copy buttons: <button class="copy" data-copy="ELEMENT-ID"> copies that element's text.
// Delegated from the document, so buttons in fragments swapped in by htmx work too.
// Without JavaScript the buttons stay hidden (see .copy in app.css) and the text stays selectable.
(function () {
  "use strict";
  document.documentElement.classList.add("js");

  function fallbackCopy(text) {
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    document.body.removeChild(area);
    return ok ? Promise.resolve() : Promise.reject(new Error("copy refused"));
  }

  function copy(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text).catch(function () { return fallbackCopy(text); });
    }
    return fallbackCopy(text);
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest("button.copy[data-copy]");
    if (!button) { return; }
    var source = document.getElementById(button.getAttribute("data-copy"));
    if (!source) { return; }
    var label = button.textContent;
    copy(source.textContent.trim()).then(
      function () { button.textContent = "Copied"; },
      function () { button.textContent = "Select and copy"; }
    ).then(function () {
      window.setTimeout(function () { button.textContent = label; }, 1500);
    });
  });
})();
