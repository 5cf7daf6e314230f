(function () {
  "use strict";
  var form = document.getElementById("submit-form");
  if (!form) return;
  var box = document.getElementById("whatif");
  var summary = document.getElementById("size-summary");

  function value(name) { var f = form.elements[name]; return f ? f.value : ""; }

  function plural(count, noun) { return count + " " + noun + (count === 1 ? "" : "s"); }

  function selectedClass() { return form.querySelector('input[name="resource_class"]:checked'); }

  function updateSummary() {
    var replicas = parseInt(value("replicas"), 10) || 0, per = parseInt(value("devices_per_pod"), 10) || 0;
    var gang = parseInt(value("min_count"), 10) || replicas;
    var rc = selectedClass(), price = rc ? rc.closest("label").querySelector(".price") : null;
    var total = replicas * per;
    if (value("claim").trim() && replicas >= 1) {
      // A claim says each pod's devices (an All request's count is known once placed): no total here.
      summary.textContent = plural(replicas, "pod") + ", " + gang + " must start together, each with the devices its claim says.";
      box.hidden = true;
      return;
    }
    if (replicas < 1 || per < 1) {
      // No negative devices and no negative price: the server refuses such a size anyway.
      summary.textContent = "A gang needs at least 1 pod and 1 device per pod.";
      box.hidden = true;
      return;
    }
    var text = plural(total, "device") + ": " + plural(replicas, "pod") + " × " + per + ", " + gang + " must start together.";
    if (rc && rc.dataset.max && total > parseInt(rc.dataset.max, 10)) text += " This class allows at most " + rc.dataset.max + " devices.";
    if (price && price.firstChild) {
      var perHour = parseFloat(price.firstChild.textContent.replace("$", ""));
      if (!isNaN(perHour)) text += " About " + (perHour * total).toLocaleString(undefined, { style: "currency", currency: "USD" }) + " per hour.";
    }
    summary.textContent = text;
    box.hidden = true;
  }

  function show(verdict, html) {
    box.hidden = false;
    box.dataset.verdict = verdict;
    box.innerHTML = html;
  }

  function escape(s) { var d = document.createElement("div"); d.textContent = s == null ? "" : String(s); return d.innerHTML; }

  var whatifButton = document.getElementById("whatif-button");  // absent for someone with no queue
  if (whatifButton) whatifButton.addEventListener("click", function () {
    show("", "Checking against the current snapshot…");
    var data = new FormData(form);
    if (!data.get("name")) data.set("name", "what-if");
    fetch(form.dataset.whatif || "/submit/whatif/", { method: "POST", body: data, credentials: "same-origin" })
      .then(function (r) { return r.json(); })
      .then(function (res) {
        if (!res.ok) {
          var errors = [];
          Object.keys(res.errors || {}).forEach(function (k) {
            [].concat(res.errors[k]).forEach(function (e) { errors.push(k + ": " + (e.message || JSON.stringify(e))); });
          });
          show("no", "<strong>Not a valid request.</strong><br>" + errors.map(escape).join("<br>"));
          return;
        }
        if (res.admitted) {
          show("yes", "<strong>Yes — it would start now</strong>" + (res.where ? " on " + escape(res.where) : "") + ".");
        } else {
          var html = "<strong>Not now</strong> — <span class='reason' data-reason='" + escape(res.reason) + "'>" + escape(res.reason) + "</span><br>" + escape(res.message);
          if (res.position_in_queue) html += "<br>It would be number " + res.position_in_queue + " in your queue.";
          if (res.estimated_start) html += "<br>Estimated start: " + escape(window.BrokerLive.when(res.estimated_start));
          if (res.suggestions && res.suggestions.length) {
            // Each one a change the form can make: one click sets the fields and asks again.
            html += "<br>What would help: <ul>" + res.suggestions.map(function (s, i) {
              return "<li>" + escape(s.description) + ' <button type="button" class="secondary apply-suggestion" data-kind="' +
                escape(s.kind) + '" data-index="' + i + '">Apply</button></li>';
            }).join("") + "</ul>";
          }
          show("no", html);
          [].forEach.call(box.querySelectorAll(".apply-suggestion"), function (button) {
            button.addEventListener("click", function () { apply(res.suggestions[parseInt(button.dataset.index, 10)].form); });
          });
        }
      })
      .catch(function (e) { show("no", "The what-if failed: " + escape(e.message)); });
  });
  function apply(fields) {
    Object.keys(fields || {}).forEach(function (name) {
      var field = form.elements[name];
      if (field) field.value = fields[name];
    });
    updateSummary();
    if (whatifButton) whatifButton.click();
  }

  /* The device class list offers only what the chosen resource class does (the server refuses the rest). */
  function offerDeviceClasses() {
    var select = form.elements.device_class, rc = selectedClass();
    if (!select || !rc) return;
    var offered = (rc.dataset.deviceClasses || "").split(" ").filter(Boolean);
    Array.prototype.forEach.call(select.options, function (option) {
      var hide = option.value !== "" && offered.indexOf(option.value) < 0;
      option.hidden = hide; option.disabled = hide;
    });
    if (select.selectedOptions.length && select.selectedOptions[0].disabled) select.value = "";
  }

  form.addEventListener("input", updateSummary);
  form.addEventListener("change", updateSummary);
  form.addEventListener("change", function (event) { if (event.target.name === "resource_class") offerDeviceClasses(); });
  offerDeviceClasses();
  updateSummary();
})();
