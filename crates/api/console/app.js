// The console's shell: the API key form and the router. A page lives in the URL's
// fragment (#/live, #/live/cam1, #/streams, #/events, #/playground, #/models); each page
// module's `mount(main, arg)` draws it and returns a function that stops its timers and
// feeds when the user leaves.

import { apiKey, setApiKey } from "./api.js";
import * as live from "./live.js";
import * as streams from "./streams.js";
import * as events from "./events.js";
import * as playground from "./playground.js";
import * as models from "./models.js";

const PAGES = { live, streams, events, playground, models };
const TITLES = {
  live: "Live", streams: "Streams", events: "Events", playground: "Playground", models: "Models",
};

let leave = null;

function route() {
  const [page, ...rest] = location.hash.replace(/^#\/?/, "").split("/");
  const name = PAGES[page] ? page : "live";
  const arg = rest.length ? decodeURIComponent(rest.join("/")) : undefined;
  if (leave) leave();
  leave = null;
  const main = document.getElementById("page");
  main.replaceChildren();
  for (const a of document.querySelectorAll("nav a")) {
    if (a.dataset.page === name) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  document.title = `${TITLES[name]} · Peregrine console`;
  leave = PAGES[name].mount(main, arg) || null;
}

function setUpKeyForm() {
  const form = document.getElementById("key-form");
  const input = document.getElementById("api-key");
  input.value = apiKey();
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    setApiKey(input.value.trim());
    route();
  });
  document.getElementById("key-forget").addEventListener("click", () => {
    input.value = "";
    setApiKey("");
    route();
  });
}

setUpKeyForm();
// The fragment is the router's, so the skip link moves the focus itself.
document.querySelector(".skip").addEventListener("click", (e) => {
  e.preventDefault();
  document.getElementById("page").focus();
});
window.addEventListener("hashchange", () => {
  route();
  document.getElementById("page").focus();
});
route();
