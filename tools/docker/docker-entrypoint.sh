#!/bin/sh
# Start PostgreSQL as the official image does for the variables testcontainers sets:
# a first start makes the cluster with POSTGRES_USER (password POSTGRES_PASSWORD) as its
# superuser and creates POSTGRES_DB, all before the server listens, so a client that gets
# in finds them. Password logins over TCP from anywhere; trust on the local socket.
set -eu
if [ "${1:-}" != postgres ]; then
    exec "$@"
fi
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "docker-entrypoint: POSTGRES_PASSWORD must be set" >&2
        exit 1
    fi
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    initdb -D "$PGDATA" --username="$POSTGRES_USER" --pwfile="$pwfile" --encoding=UTF8 --locale=C.UTF-8 \
        --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    if [ "$POSTGRES_DB" != postgres ]; then
        db="$(printf '%s' "$POSTGRES_DB" | sed 's/"/""/g')"
        echo "CREATE DATABASE \"$db\"" | postgres --single -D "$PGDATA" postgres >/dev/null
    fi
fi
shift
exec postgres -D "$PGDATA" -c listen_addresses='*' -p 5432 "$@"
