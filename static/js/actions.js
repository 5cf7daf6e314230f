/* Operator and owner actions are plain POST forms; this asks before anything irreversible happens. */
document.addEventListener("submit", function (event) {
  var form = event.target;
  if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) event.preventDefault();
});
