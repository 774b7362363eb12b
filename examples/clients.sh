#!/bin/sh
# Onboards, upgrades, raises for a launch week and revokes a customer
# through floodgate's admin API. See docs/book/clients.md. Needs curl;
# ADMIN, TOKEN_FILE and LIMIT (a limit keyed on api_key) may be set.
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

# A launch week: this customer's own numbers under the per-account limit,
# until a week from now (GNU date, else BSD date, else EXPIRES).
LIMIT="${LIMIT:-per-account}"
EXPIRES="${EXPIRES:-$(date -u -d '+7 days' +%Y-%m-%dT%H:%M:%SZ 2>/dev/null || date -u -v+7d +%Y-%m-%dT%H:%M:%SZ)}"
echo "# raise: capacity 5000 at 100/s under $LIMIT until $EXPIRES"
api PUT /v1/overrides --data "{\"limit\": \"$LIMIT\", \"key_hash\": \"$hash\", \"capacity\": 5000, \"refill_rate\": 100, \"expires\": \"$EXPIRES\", \"label\": \"launch week\"}"

echo "# the numbers in force for it"
api GET "/v1/clients?key_hash=$hash&limit=$LIMIT"

echo "# end the raise early: its tier's numbers again"
api DELETE "/v1/overrides?limit=$LIMIT&key_hash=$hash"

echo "# revoke: from now on the key is no key at all"
api DELETE "/v1/api_keys?key_hash=$hash"
