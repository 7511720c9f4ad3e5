#!/usr/bin/env bash
# Make a private CA and one certificate per PathMaster party, each for one role, for mutual TLS.
#
#   bash deploy/make-certs.sh OUT_DIR [ROLE:]NAME[=HOST,HOST...] ...
#   bash deploy/make-certs.sh certs coordinator site:connecticut=ct.example.org site:new-york client:dr-lee gateway
#
# ROLE is coordinator, site, client (a pathologist's query/batch) or gateway (the web page);
# a NAME that is a role needs no ROLE ("gateway" is gateway:gateway). Each certificate carries
# its role as the URI pathmaster://role/ROLE (servers check it on every call: sites accept
# coordinators only, the coordinator clients and gateways) and only the key usage it needs:
# coordinator serverAuth+clientAuth (it serves clients and calls sites), site serverAuth and
# clientAuth (only for its own health probe: the role check still refuses it every RPC),
# gateway serverAuth+clientAuth (it serves the page over HTTPS and calls the coordinator),
# client clientAuth. A server's certificate names NAME, localhost, 127.0.0.1 and
# the HOSTs given after '='. Writes OUT_DIR/ca.pem (+ ca.key, keep it offline) and
# OUT_DIR/NAME.pem, NAME.key (0600). An existing CA in OUT_DIR is reused, so parties can be
# added later. Point a [tls] section at them: cert = "NAME.pem", key = "NAME.key", ca = "ca.pem".
# Rotating: write the new files elsewhere, then mv them over the old ones; running servers
# use them for every new connection.
set -euo pipefail
if [ $# -lt 2 ]; then
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
out=$1; shift
mkdir -p "$out"
umask 077
days=825
key_args=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256)
if [ ! -f "$out/ca.pem" ]; then
    openssl req -x509 "${key_args[@]}" -days 3650 -subj "/CN=PathMaster CA" \
        -addext "basicConstraints=critical,CA:TRUE,pathlen:0" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -keyout "$out/ca.key" -out "$out/ca.pem" 2>/dev/null
fi
for spec in "$@"; do
    party=${spec%%=*}
    hosts=""
    [ "$spec" != "$party" ] && hosts=${spec#*=}
    if [[ $party == *:* ]]; then role=${party%%:*}; name=${party#*:}; else role=$party; name=$party; fi
    case $role in
        coordinator) eku=serverAuth,clientAuth ;;
        site) eku=serverAuth,clientAuth ;;  # clientAuth: `pathmaster health` with its own files
        gateway) eku=serverAuth,clientAuth ;;  # it serves the page over HTTPS and calls the coordinator
        client) eku=clientAuth ;;
        *) echo "make-certs.sh: '$spec': the role must be coordinator, site, client or gateway" \
               "(write ROLE:NAME, e.g. site:$name)" >&2; exit 2 ;;
    esac
    if [[ ! $name =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$ ]]; then
        echo "make-certs.sh: '$name': a name is letters, digits, '.', '_' and '-' (at most 63)" >&2; exit 2
    fi
    san="URI:pathmaster://role/$role"
    if [[ $eku == serverAuth* ]]; then
        san="$san,DNS:$name,DNS:localhost,IP:127.0.0.1"
        IFS=',' read -ra extra <<< "$hosts"
        for h in "${extra[@]}"; do
            if [[ ! $h =~ ^[A-Za-z0-9.:-]+$ ]]; then echo "make-certs.sh: bad host '$h'" >&2; exit 2; fi
            if [[ $h =~ ^[0-9.]+$ || $h == *:* ]]; then san="$san,IP:$h"; else san="$san,DNS:$h"; fi
        done
    elif [ -n "$hosts" ]; then
        echo "make-certs.sh: '$spec': a $role certificate is for calling, not serving: it takes no hosts" >&2; exit 2
    fi
    openssl req "${key_args[@]}" -subj "/CN=$name/OU=$role" \
        -keyout "$out/$name.key" -out "$out/$name.csr" 2>/dev/null
    printf 'subjectAltName=%s\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=%s\n' \
        "$san" "$eku" > "$out/$name.ext"
    openssl x509 -req -in "$out/$name.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" -CAcreateserial \
        -days "$days" -sha256 -extfile "$out/$name.ext" -out "$out/$name.pem" 2>/dev/null
    rm -f "$out/$name.csr" "$out/$name.ext"
    chmod 644 "$out/$name.pem"
    echo "$out/$name.pem ($role: $eku; $san)"
done
chmod 644 "$out/ca.pem"
