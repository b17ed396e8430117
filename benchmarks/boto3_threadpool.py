"""The usual Python answer to "download a bucket fast": boto3 and a ThreadPoolExecutor, written
as the tutorials write it (list with the paginator, one get_object per key in a pool of 64
threads, each body written to DEST/KEY). A peer row of benchmarks/s3_get.py:

    python benchmarks/boto3_threadpool.py ENDPOINT BUCKET DEST [--ca-bundle FILE]

Credentials come from the environment, as boto3 reads them. Prints the objects written.
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ThreadPoolExecutor

import boto3
from botocore.config import Config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("endpoint")
    parser.add_argument("bucket")
    parser.add_argument("dest")
    parser.add_argument("--ca-bundle", default=None)
    parser.add_argument("--threads", type=int, default=64)
    args = parser.parse_args()
    client = boto3.client("s3", endpoint_url=args.endpoint, verify=args.ca_bundle or True,
                          config=Config(max_pool_connections=args.threads,
                                        s3={"addressing_style": "path"}))

    def download(key: str) -> None:
        path = os.path.join(args.dest, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        body = client.get_object(Bucket=args.bucket, Key=key)["Body"].read()
        with open(path, "wb") as handle:
            handle.write(body)

    keys = [item["Key"]
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=args.bucket)
            for item in page.get("Contents", [])]
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        for _ in pool.map(download, keys):
            pass
    print(len(keys))


if __name__ == "__main__":
    main()
