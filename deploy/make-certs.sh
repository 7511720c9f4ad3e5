#!/usr/bin/env bash
# Make a private CA and one certificate per PathMaster party, for TLS / mutual TLS.
#
#   bash deploy/make-certs.sh OUT_DIR NAME[=HOST,HOST...] ...
#   bash deploy/make-certs.sh certs coordinator connecticut=ct.example.org new-york california
#
# Writes OUT_DIR/ca.pem (+ ca.key, keep it offline) and OUT_DIR/NAME.pem, NAME.key for each
# NAME. Every certificate is valid as server and client (a coordinator serves clients and
# is a client of the sites) for NAME, localhost, 127.0.0.1 and the HOSTs given after '='.
# Point a [tls] section at them: cert = "NAME.pem", key = "NAME.key", ca = "ca.pem".
# An existing CA in OUT_DIR is reused, so parties can be added later.
set -euo pipefail
if [ $# -lt 2 ]; then
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
out=$1; shift
mkdir -p "$out"
umask 077
days=825
if [ ! -f "$out/ca.pem" ]; then
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
        -subj "/CN=PathMaster CA" -keyout "$out/ca.key" -out "$out/ca.pem" 2>/dev/null
fi
for spec in "$@"; do
    name=${spec%%=*}
    hosts=""
    [ "$spec" != "$name" ] && hosts=${spec#*=}
    san="DNS:$name,DNS:localhost,IP:127.0.0.1"
    IFS=',' read -ra extra <<< "$hosts"
    for h in "${extra[@]}"; do
        if [[ $h =~ ^[0-9.]+$ ]]; then san="$san,IP:$h"; else san="$san,DNS:$h"; fi
    done
    openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=$name" \
        -keyout "$out/$name.key" -out "$out/$name.csr" 2>/dev/null
    printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' \
        "$san" > "$out/$name.ext"
    openssl x509 -req -in "$out/$name.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" -CAcreateserial \
        -days "$days" -sha256 -extfile "$out/$name.ext" -out "$out/$name.pem" 2>/dev/null
    rm -f "$out/$name.csr" "$out/$name.ext"
    echo "$out/$name.pem ($san)"
done
chmod 644 "$out"/*.pem
