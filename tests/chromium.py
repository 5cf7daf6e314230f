"""Debian's Chromium, launched the one way this machine allows: headless, sandbox-less, and with no
background networking (the network is closed; Chromium would otherwise keep trying to reach out)."""

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
]
