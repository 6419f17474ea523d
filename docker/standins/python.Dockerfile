# Stand-in for python:3.11-slim (the provider-wheel stage of both project images): Debian 12's
# Python 3.11 with pip, `python` and `pip` on PATH as in the official image.
FROM ahp-standins/debian:bookworm
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY pip.conf /etc/pip.conf
# Debian marks its Python as managed by apt; the official image's Python is not.
RUN rm -f /usr/lib/python3.11/EXTERNALLY-MANAGED \
    && ln -s /usr/bin/python3.11 /usr/local/bin/python \
    && ln -s /usr/bin/pip3 /usr/local/bin/pip
ENV PYTHONDONTWRITEBYTECODE=1 LANG=C.UTF-8
CMD ["python3"]
