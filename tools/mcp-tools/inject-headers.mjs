// Preload for the MCP conformance CLI (`node --import ./inject-headers.mjs ...`), used by
// tests/mcptools.py: the CLI has no option to send extra HTTP headers (such as
// `Authorization: Bearer <token>`), so this adds them to every request it makes to one origin.
//
// CORRAL_MCP_EXTRA_HEADERS is a JSON object {"origin": "http://127.0.0.1:8080", "headers": {...}}.
// It wraps undici's global dispatcher, which serves both Node's built-in fetch (the MCP SDK's
// Streamable HTTP client transport and the raw-fetch scenarios) and undici.request (the
// dns-rebinding-protection scenario). A header the request already sets is left as it is.
import { getGlobalDispatcher, setGlobalDispatcher } from "undici";

const spec = JSON.parse(process.env.CORRAL_MCP_EXTRA_HEADERS ?? "null");
if (spec && spec.headers && Object.keys(spec.headers).length > 0) {
  const origin = new URL(spec.origin).origin;
  const extra = Object.entries(spec.headers);

  const withExtra = (headers) => {
    let pairs;
    if (headers == null) pairs = [];
    else if (Array.isArray(headers)) {
      pairs = [];
      if (headers.length > 0 && Array.isArray(headers[0])) pairs = headers.map(([k, v]) => [String(k), v]);
      else for (let i = 0; i < headers.length; i += 2) pairs.push([String(headers[i]), headers[i + 1]]);
    } else if (typeof headers[Symbol.iterator] === "function") pairs = [...headers].map(([k, v]) => [String(k), v]);
    else pairs = Object.entries(headers);
    const present = new Set(pairs.map(([k]) => k.toLowerCase()));
    for (const [k, v] of extra) if (!present.has(k.toLowerCase())) pairs.push([k, v]);
    return Object.fromEntries(pairs);
  };

  setGlobalDispatcher(
    getGlobalDispatcher().compose((dispatch) => (opts, handler) => {
      const target = typeof opts.origin === "string" ? opts.origin : opts.origin?.toString();
      if (target && new URL(target).origin === origin) opts = { ...opts, headers: withExtra(opts.headers) };
      return dispatch(opts, handler);
    }),
  );
}
