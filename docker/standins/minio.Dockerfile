# Stand-ins for minio/minio and minio/mc (two targets): moto's S3 server on port 9000 in place of
# MinIO, and a small `mc` that knows the commands compose.yaml and the checks use (`ready`,
# `alias set`, `mb`, `ls`). The S3 API is moto's; it accepts any key, keeps objects in memory (not in
# /data) and has no console on 9001.
FROM ahp-standins/debian:bookworm AS s3
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY pip.conf /etc/pip.conf
ENV PATH=/opt/moto/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
RUN python3.11 -m venv /opt/moto \
    && pip install --no-cache-dir "moto[server]==5.2.5" "boto3==1.44.8"
COPY --chmod=755 mc.py /usr/bin/mc
COPY --chmod=755 minio.sh /usr/bin/minio

FROM s3 AS minio
EXPOSE 9000 9001
ENTRYPOINT ["/usr/bin/minio"]

FROM s3 AS mc
ENTRYPOINT ["/usr/bin/mc"]
