#!/bin/sh
# Starts Alertmanager with the webhook URL of docker/alertmanager.yml taken from
# $ALERTMANAGER_WEBHOOK_URL (Alertmanager itself does not expand environment variables).
# Arguments are passed on to Alertmanager. POSIX sh and awk: runs in the busybox-based
# prom/alertmanager image.
set -eu
template=${ALERTMANAGER_TEMPLATE:-/etc/alertmanager/alertmanager.yml}
rendered=${ALERTMANAGER_RENDERED:-/alertmanager/alertmanager.yml}
placeholder='http://alert-webhook.invalid/calibd'

if [ -n "${ALERTMANAGER_WEBHOOK_URL:-}" ]; then
    # index/substr rather than sub(): the URL is inserted literally, whatever it contains.
    awk -v placeholder="$placeholder" '{
        i = index($0, placeholder)
        if (i) $0 = substr($0, 1, i - 1) ENVIRON["ALERTMANAGER_WEBHOOK_URL"] substr($0, i + length(placeholder))
        print
    }' "$template" > "$rendered"
else
    echo "alertmanager-entrypoint: ALERTMANAGER_WEBHOOK_URL is not set; notifications go to the placeholder $placeholder" >&2
    cp "$template" "$rendered"
fi
exec "${ALERTMANAGER_BIN:-/bin/alertmanager}" --config.file="$rendered" "$@"
