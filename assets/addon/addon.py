"""ppp's mitmproxy addon: egress policy and secret injection for sandboxes.

The file `mitmdump -s` loads. It only wires the package beside it,
`ppp_addon/`, into mitmproxy's hooks: every decision, bound and record is
made in one of its modules (the table in docs/architecture.md says which
hook calls which). Every guest reaches mitmdump over WireGuard, one server
(UDP port) per sandbox. The addon:

* names the sandbox from the WireGuard server's listen port, looked up in
  `$PPP_DATA/port-registry.json` (never from the peer address);
* asks the ppp daemon (`$PPP_DATA/secret.sock`, NDJSON) for every decision
  and caches the answer per (sandbox, host, ip, port) until the daemon's
  generation changes; there is no matching logic here;
* fails closed: an unknown port, a daemon that does not answer, or any
  error inside a hook denies the flow;
* injects API keys and custom placeholders the daemon hands out, only into
  requests the policy allowed;
* appends one JSON line per flow to `$PPP_DATA/flows.jsonl`, never with a
  secret value in it;
* keeps mitmdump's WireGuard servers in line with the claimed ports: when
  the daemon's generation moves it asks for the `modes` list and applies it,
  so a sandbox gains or loses its server without a restart;
* records when each server last carried a connection in
  `$PPP_DATA/tunnels.json`, for `ppp daemon status`.

See docs/addon.md for how each kind of denial is enforced.
"""

import asyncio
import importlib.util
import os
import sys
from typing import Any

from mitmproxy import ctx


def _load_package() -> None:
    """Import `ppp_addon` from this file's own directory, whatever else is
    on `sys.path` or in `sys.modules`.

    mitmproxy's script loader (mitmproxy/addons/script.py, `load_script`)
    puts this file's directory first on `sys.path` only while the file
    runs, and leaves `sys.modules` alone: a plain `import ppp_addon` would
    reuse a package already imported (an earlier load of this script, or
    another copy's in the same interpreter) or find one elsewhere on the
    path. ppp writes each version of the addon to its own directory (named
    by a hash of its files, src/proxy/mitmdump.rs), so the modules beside
    this file are the ones that go with it: they are loaded by path, after
    every cached `ppp_addon` module is dropped."""
    here = os.path.dirname(os.path.abspath(__file__))
    pkg = os.path.join(here, "ppp_addon")
    for name in [n for n in sys.modules if n == "ppp_addon" or n.startswith("ppp_addon.")]:
        del sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        "ppp_addon", os.path.join(pkg, "__init__.py"), submodule_search_locations=[pkg]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"ppp: no addon package at {pkg}")
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: its modules import each other through it.
    sys.modules["ppp_addon"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop("ppp_addon", None)
        raise


_load_package()

from ppp_addon import patches  # noqa: E402 - needs _load_package first
from ppp_addon.connections import Connections  # noqa: E402
from ppp_addon.daemon import Daemon  # noqa: E402
from ppp_addon.dns_guard import Dns  # noqa: E402
from ppp_addon.http_flow import Http  # noqa: E402
from ppp_addon.watch import Watch  # noqa: E402


class PppAddon(Watch, Connections, Dns, Http):
    """mitmproxy's hooks, each answered by the module that decides it:

    * load, configure, running, done: here (patches, options, the daemon
      client, the background task of `watch`);
    * client_connected, client_disconnected, server_connect,
      tls_clienthello, tcp_*, udp_*: `connections`;
    * dns_request, dns_response: `dns_guard`;
    * requestheaders, request, responseheaders, response, error,
      websocket_*: `http_flow`.

    Each asks `decisions` (and `holds` for a flow left to the user),
    `inject` adds keys, `limits` bounds bodies, `flowlog` records."""

    # ---- lifecycle -------------------------------------------------------

    def load(self, loader: Any) -> None:
        patches.install(ctx.master.addons)
        loader.add_option("ppp_state_dir", str, "", "ppp's data directory ($PPP_DATA)")

    def configure(self, updated: set[str]) -> None:
        # Read here, not per request: an option lookup costs a few µs.
        self._ssl_insecure = bool(getattr(ctx.options, "ssl_insecure", False))
        if "ppp_state_dir" in updated or self.daemon is None:
            self.state_dir = ctx.options.ppp_state_dir or os.environ.get("PPP_DATA", "")
            self._gen_path = os.path.join(self.state_dir, "generation")
            self._index_path = os.path.join(self.state_dir, "secrets-index.json")
            self._flow_path = os.path.join(self.state_dir, "flows.jsonl")
            self._registry_path = os.path.join(self.state_dir, "port-registry.json")
            if self.daemon is not None:
                self.daemon.close()
            self.daemon = Daemon(os.path.join(self.state_dir, "secret.sock")) if self.state_dir else None
            self._invalidate(None)
            self._registry_stamp = None
            self._close_flow_log()

    def running(self) -> None:
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    def done(self) -> None:
        self._close_flow_log()
        if self._watcher is not None:
            self._watcher.cancel()
        if self._pool is not None:
            # A thread still waiting on the daemon ends with its socket
            # timeout; nobody awaits its answer any more.
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self.daemon is not None:
            self.daemon.close()


addons = [PppAddon()]
