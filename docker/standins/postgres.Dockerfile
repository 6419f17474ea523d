# Stand-in for postgres:16: Debian 12's PostgreSQL 15, with the official image's contract that
# compose.yaml uses: POSTGRES_USER/PASSWORD/DB create the role and database on first start,
# PGDATA=/var/lib/postgresql/data (a volume), port 5432, pg_isready on PATH.
FROM ahp-standins/debian:bookworm
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/*
COPY --chmod=755 postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PGDATA=/var/lib/postgresql/data \
    LANG=C.UTF-8
VOLUME /var/lib/postgresql/data
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]
