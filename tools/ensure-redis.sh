#!/bin/sh
# The fleet tests (tests/integration/fleet) need a real redis-server: install the Debian package where apt-get
# runs as root; elsewhere say how to get one and fail (make test stops here).
command -v redis-server >/dev/null 2>&1 || test -x /usr/bin/redis-server && exit 0
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing redis-server (Debian package) for the fleet tests"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null && exit 0
fi
echo "redis-server is missing: the fleet tests need one. Install Redis >= 6 so that redis-server is on the" >&2
echo "PATH (apt-get install redis-server, brew install redis, dnf install redis), then run make test again." >&2
exit 1
