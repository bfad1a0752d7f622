"""An S3-compatible server on a loopback port, for tests: moto's server mode, in this process.

It speaks the S3 API over HTTP (pyarrow, boto3 and a subprocess's clients reach it through
``AWS_ENDPOINT_URL``), records the requests it answered (method and path: what a batch costs
in requests), and can turn on moto's IAM checks for a test of denied access.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.request
import uuid
from typing import Any

# Dummy credentials: moto accepts any until its IAM checks are on. The secret is distinctive so
# that a test can assert it appears nowhere.
ACCESS_KEY_ID = "AKIAUPSERTTESTKEY000"
SECRET_ACCESS_KEY = "upsert-test-secret-Zq8Rk2Lw"
REGION = "us-east-1"

# The kinds of request a batch is counted in (docs/storage.md, "What a batch costs"): LIST is
# ListObjectsV2, DELETE a single or batched (``POST ?delete``) deletion, "other" anything
# else (multipart upload's create and complete, bucket-level queries).
REQUEST_KINDS = ("PUT", "GET", "LIST", "DELETE", "HEAD", "other")


def request_kind(method: str, target: str) -> str:
    """The kind of a request, from its method and its target (``path?query``)."""
    params = {part.partition("=")[0] for part in target.partition("?")[2].split("&") if part}
    if method in ("PUT", "HEAD", "DELETE"):  # a PUT of a multipart upload's part too
        return method
    if method == "POST":
        return "DELETE" if "delete" in params else "other"
    if method == "GET":
        if "list-type" in params:
            return "LIST"
        return "GET" if not params - {"partNumber", "versionId"} else "other"
    return "other"


class S3Server:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        # werkzeug logs every request line on stderr.
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.endpoint = ""
        self._lock = threading.Lock()
        self._requests: list[tuple[str, str]] = []

    def start(self) -> "S3Server":
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        # Record (method, path?query) of every request the server answers.
        wsgi = self._server._server  # the werkzeug server ThreadedMotoServer started
        app = wsgi.app

        def recording(environ: dict[str, Any], start_response: Any) -> Any:
            query = environ.get("QUERY_STRING", "")
            with self._lock:
                self._requests.append((environ["REQUEST_METHOD"], environ["PATH_INFO"] + (f"?{query}" if query else "")))
            return app(environ, start_response)

        wsgi.app = recording
        return self

    def stop(self) -> None:
        self._server.stop()

    def environment(self) -> dict[str, str]:
        """The variables a process needs to reach this server with the dummy credentials."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
            "AWS_REGION": REGION,
            # Never ask an instance metadata service on the test machine for anything.
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self, service: str = "s3", **credentials: str) -> Any:
        import boto3

        return boto3.client(
            service, endpoint_url=self.endpoint, region_name=REGION,
            aws_access_key_id=credentials.get("key", ACCESS_KEY_ID),
            aws_secret_access_key=credentials.get("secret", SECRET_ACCESS_KEY),
        )

    def create_bucket(self, name: str | None = None) -> str:
        name = name or f"t-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key below ``prefix`` in ``bucket``, directory markers included."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def age(self, bucket: str, prefix: str = "", seconds: float = 3 * 3600) -> int:
        """Make every object below ``prefix`` in ``bucket`` look ``seconds`` older (its
        last-modified time, which GC's grace period is measured from), as ``os.utime`` does on
        disk: the server runs in this process, so its store is changed directly. Returns how
        many object versions were aged."""
        from datetime import timedelta

        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        aged = 0
        for key_name, versions in s3_backends[DEFAULT_ACCOUNT_ID]["aws"].buckets[bucket].keys.iterlists():
            if not key_name.startswith(prefix):
                continue
            for key in versions:
                key.last_modified = key.last_modified - timedelta(seconds=seconds)
                aged += 1
        return aged

    def requests(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._requests)

    def denied_credentials(self) -> tuple[str, str]:
        """(key id, secret) of an IAM user with no policy: every request it signs is denied
        while :meth:`checking_access` is on."""
        iam = self.client("iam")
        user = f"nobody-{uuid.uuid4().hex[:8]}"
        iam.create_user(UserName=user)
        key = iam.create_access_key(UserName=user)["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    def role_credentials(self, bucket: str | None = None) -> tuple[str, str, str]:
        """(key id, secret, session token) of a freshly assumed role that may do anything on S3
        (on ``bucket`` only, when given): while :meth:`checking_access` is on, a request is
        allowed only when signed with all three (a missing or wrong token is refused).
        Distinctive values, new on every call."""
        role = f"upsert-{uuid.uuid4().hex[:8]}"
        iam = self.client("iam")
        iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}]}))
        resource = [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"] if bucket else "*"
        iam.put_role_policy(RoleName=role, PolicyName="s3", PolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": resource}]}))
        credentials = self.client("sts").assume_role(RoleArn=f"arn:aws:iam::123456789012:role/{role}",
                                                     RoleSessionName="upsert-tests")["Credentials"]
        return credentials["AccessKeyId"], credentials["SecretAccessKey"], credentials["SessionToken"]

    def checking_access(self, on: bool) -> None:
        """Turn moto's IAM authorization of every request on or off (off by default)."""
        # A form content type would make the server parse the body away: plain text.
        request = urllib.request.Request(f"{self.endpoint}/moto-api/reset-auth", data=b"0" if on else b"inf",
                                         method="POST", headers={"Content-Type": "text/plain"})
        with urllib.request.urlopen(request, timeout=10) as response:
            json.load(response)
