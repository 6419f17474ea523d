#!/opt/moto/bin/python
"""A small `mc` for the MinIO stand-in: `ready ALIAS`, `alias set ALIAS URL KEY SECRET`,
`mb [--ignore-existing] ALIAS/BUCKET` and `ls ALIAS/BUCKET[/PREFIX]` (recursive), through boto3.
Aliases are kept in ~/.mc/config.json as mc keeps them; `local` is http://localhost:9000."""

import json
import sys
import urllib.request
from pathlib import Path

CONFIG = Path.home() / ".mc" / "config.json"


def aliases() -> dict:
    known = json.loads(CONFIG.read_text())["aliases"] if CONFIG.exists() else {}
    known.setdefault("local", {"url": "http://localhost:9000", "accessKey": "", "secretKey": ""})
    return known


def client(alias: str):
    import boto3  # here: `mc ready`, the health check, stays quick

    a = aliases()[alias]
    return boto3.client(
        "s3",
        endpoint_url=a["url"],
        aws_access_key_id=a["accessKey"] or "minioadmin",
        aws_secret_access_key=a["secretKey"] or "minioadmin",
        region_name="us-east-1",
    )


def main(args: list[str]) -> int:
    if args[:1] == ["ready"]:
        urllib.request.urlopen(aliases()[args[1]]["url"] + "/", timeout=3)
        return 0
    if args[:2] == ["alias", "set"]:
        name, url, key, secret = args[2:6]
        known = aliases()
        known[name] = {"url": url, "accessKey": key, "secretKey": secret}
        CONFIG.parent.mkdir(parents=True, exist_ok=True)
        CONFIG.write_text(json.dumps({"version": "10", "aliases": known}))
        print(f"Added `{name}` successfully.")
        return 0
    if args[:1] == ["mb"]:
        target = [a for a in args[1:] if not a.startswith("--")][0]
        alias, bucket = target.split("/", 1)
        s3 = client(alias)
        existing = {b["Name"] for b in s3.list_buckets()["Buckets"]}
        if bucket in existing:
            if "--ignore-existing" in args:
                return 0
            print(f"mc: bucket {bucket} exists", file=sys.stderr)
            return 1
        s3.create_bucket(Bucket=bucket)
        print(f"Bucket created successfully `{target}`.")
        return 0
    if args[:1] == ["ls"]:
        alias, _, rest = args[-1].partition("/")
        bucket, _, prefix = rest.partition("/")
        pages = client(alias).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for page in pages:
            for obj in page.get("Contents", []):
                print(f"{obj['Size']:>10} {obj['Key']}")
        return 0
    print(f"mc stand-in: unknown command {args}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
