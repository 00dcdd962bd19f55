"""ppp's mitmproxy addon, one module per concern.

Loaded by the entry file beside this package (`addon.py`, the one
`mitmdump -s` names), never from anywhere else on `sys.path`. From the
bottom up:

* `common`: the log, the bounded map (`Lru`), small pure helpers;
* `names`: the one name a request is judged on; addresses parsed;
* `daemon`: the daemon socket's client;
* `scheduler`: the event loop shared between sandboxes; held clients;
* `limits`: body, header, message and connection bounds;
* `patches`: every change to mitmproxy's own code;
* `verdict`: what a decision is, and the addon's own ones;
* `flowlog`: flows.jsonl, its throttle and rotation;
* `state`: what the concerns share, the base of their classes;
* `decisions`: the daemon's verdicts and their caches;
* `holds`: requests held for the user's approval;
* `scrubber`: secret values echoed back, replaced;
* `inject`: keys and placeholders into allowed requests;
* `usage`: the tokens a metered LLM response reports, read as it streams;
* `watch`: the background task (servers, tunnels, open streams);
* `connections`, `dns_guard`, `http_flow`: the hooks of each protocol.

Each module's docstring says what it decides or bounds and what it must
never trust. docs/architecture.md has the table of hooks and modules.
"""
