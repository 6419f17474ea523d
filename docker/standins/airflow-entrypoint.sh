#!/usr/bin/env bash
# The stand-in's /entrypoint: as the official image's, `bash` and `python` run as given and any
# other command is an Airflow subcommand. (The official one also waits for the database, and can
# create a user and migrate on start; compose.yaml uses none of that.)
set -euo pipefail
if [ "$#" -eq 0 ]; then
  exec airflow --help
fi
case "$1" in
  bash | python | python3) exec "$@" ;;
  *) exec airflow "$@" ;;
esac
