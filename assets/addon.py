"""ppp's mitmproxy addon (placeholder until the real addon lands)."""
