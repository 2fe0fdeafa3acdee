#!/usr/bin/env bash
# The third-party programs the test suite runs against (make test calls this before pytest):
#   nginx           an upstream of the HTTP differential suite (tests/compat/http)
#   netcat-openbsd  `nc -N`, a client that half-closes after its request
#   curl            a rate-limited upload client
#   chromium        the headless browser of the console's page tests (tests/integration/console), and
#   chromium-driver its chromedriver, through which Selenium drives it (nothing downloaded)
#   tmux            a real terminal for `sidecar tap` and `sidecar top` (send-keys, capture-pane)
#   dnsmasq-base    a real DNS server whose answers the discovery tests change (tests/integration/discovery;
#                   the dnsmasq binary alone, no system service)
#   nodejs, npm     the MongoDB Node.js driver of the compat suite (tests/compat/mongo/node: `npm ci` from its
#                   package-lock.json, the registry's own client)
# Installed from Debian's packages where this machine has apt and we are root; elsewhere the tests that need
# a missing program fail and name it (install it by hand, then run make test again).
set -euo pipefail
missing=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx)
{ command -v nc >/dev/null && nc -h 2>&1 | grep -q -- '-N'; } || missing+=(netcat-openbsd)
command -v curl >/dev/null || missing+=(curl)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
command -v tmux >/dev/null || missing+=(tmux)
command -v dnsmasq >/dev/null || [ -x /usr/sbin/dnsmasq ] || missing+=(dnsmasq-base)
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "test-deps: installing ${missing[*]} (apt-get)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "test-deps: missing ${missing[*]} and cannot install them here (needs root and apt-get):" \
             "the tests that use them will fail" >&2
    fi
fi
node_dir="$(dirname "$0")/../tests/compat/mongo/node"
if command -v npm >/dev/null && [ ! "$node_dir/node_modules/.package-lock.json" -nt "$node_dir/package-lock.json" ]; then
    echo "test-deps: installing the MongoDB Node.js driver (npm ci in tests/compat/mongo/node)"
    (cd "$node_dir" && npm ci --no-audit --no-fund --silent) || echo "test-deps: npm ci failed" >&2
fi
