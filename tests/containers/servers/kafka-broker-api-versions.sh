#!/bin/bash
# Stand-in for Kafka's tool in the compose health check: succeeds when the bootstrap server
# accepts a connection (the Maven jars the stand-in is built from do not include kafka-tools).
while [ $# -gt 0 ]; do
    [ "$1" = "--bootstrap-server" ] && server="$2"
    shift
done
exec 3<>"/dev/tcp/${server%:*}/${server##*:}"
