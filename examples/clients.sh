#!/bin/sh
# Onboards, upgrades and revokes a customer through floodgate's admin API.
# See docs/book/clients.md. Needs curl; ADMIN and TOKEN_FILE may be set.
#
#   KEY=sk_live_... ./examples/clients.sh
set -eu

ADMIN="${ADMIN:-http://127.0.0.1:9091}"
TOKEN="$(cat "${TOKEN_FILE:-/etc/floodgate/admin.token}")"
# The customer's new key: made here unless given. It is sent once, to be
# hashed; floodgate answers with its hash, which is all it keeps.
KEY="${KEY:-sk_live_$(openssl rand -hex 16)}"

api() {
    method="$1"; path="$2"; shift 2
    curl --fail-with-body --silent --show-error -X "$method" \
        -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \
        "$ADMIN$path" "$@"
    echo
}

echo "# onboard: tier free, labelled with the customer's id"
answer="$(api PUT /v1/api_keys --data "{\"key\": \"$KEY\", \"tier\": \"free\", \"label\": \"customer-42\"}")"
echo "$answer"
hash="$(printf '%s' "$answer" | sed -n 's/.*"key_hash": *"\([0-9a-f]*\)".*/\1/p')"

echo "# upgrade: tier pro, on every instance within a second"
api PUT /v1/api_keys --data "{\"key\": \"$KEY\", \"tier\": \"pro\", \"label\": \"customer-42\"}"

echo "# what floodgate knows of it, by hash"
api GET "/v1/api_keys?key_hash=$hash"

echo "# revoke: from now on the key is no key at all"
api DELETE "/v1/api_keys?key_hash=$hash"
