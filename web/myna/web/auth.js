// Access tokens, for a worker started with keys (docs/deployment.md, "Access tokens"): taken from
// `?token=` in the page's URL, or typed into a field the page shows when the worker asks for one.
const STORAGE_KEY = "myna.token";
let token = new URLSearchParams(location.search).get("token") || sessionStorage.getItem(STORAGE_KEY) || "";

export function authHeaders() {
  return token ? { Authorization: `Bearer ${token}` } : {};
}

export function hasToken() {
  return !!token;
}

// Show the token field in the top bar (once); `reason` says why (e.g. the worker's 401 message).
export function askForToken(reason = "This worker needs an access token") {
  let field = document.getElementById("token");
  if (!field) {
    field = Object.assign(document.createElement("input"), {
      id: "token", type: "password", placeholder: "Access token", autocomplete: "off", className: "token-field",
    });
    field.setAttribute("aria-label", "Access token");
    field.addEventListener("change", () => {
      token = field.value.trim();
      sessionStorage.setItem(STORAGE_KEY, token);
    });
    document.querySelector(".topbar").append(field);
  }
  field.title = reason;
}
