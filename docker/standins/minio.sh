#!/bin/sh
# `minio server DIR [--console-address ADDR]` (with or without the leading `minio`, as MinIO's
# entrypoint takes it): moto's S3 server on port 9000 instead.
[ "${1:-}" = minio ] && shift
[ "${1:-}" = server ] || { echo "minio stand-in: only 'server' is known" >&2; exit 2; }
exec moto_server -H 0.0.0.0 -p 9000
