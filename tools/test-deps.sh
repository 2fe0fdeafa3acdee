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
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "test-deps: installing ${missing[*]} (apt-get)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
    echo "test-deps: missing ${missing[*]} and cannot install them here (needs root and apt-get):" \
         "the tests that use them will fail" >&2
fi
