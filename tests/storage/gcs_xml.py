"""A Google Cloud Storage XML-API server for the storage tests, on loopback, in a process of its own.

Why our own: obstore speaks GCS's XML API (https://cloud.google.com/storage/docs/xml-api/overview), and
neither packaged emulator serves it whole (docs/storage.md, "Emulators"): fake-gcs-server rejects XML
uploads ("invalid uploadType"), gcp-storage-emulator sends no ETag / Last-Modified, and the fake-gcs-server
fork that object_store's CI builds needs a Go toolchain and Go modules, which CI machines here cannot fetch.

What it serves is what obstore sends (object_store's gcp/client.rs), answered as GCS documents it:
objects GET/HEAD (Range incl. suffix ranges, If-Match / If-None-Match, ETag, Last-Modified,
x-goog-generation), PUT (x-goog-if-generation-match: 0 for create-only, x-goog-copy-source), DELETE
(404 NoSuchKey when absent, as GCS), XML multipart uploads (POST ?uploads, PUT ?partNumber&uploadId,
POST ?uploadId, DELETE ?uploadId), bucket listing (list-type=2, prefix, delimiter, continuation-token,
max-keys), errors as `<Error><Code>NoSuchBucket|NoSuchKey|PreconditionFailed|...</Code>`, and a bearer
token checked on every request (401 without one, 403 with a wrong one). Objects live in a folder, so a
server killed with SIGKILL and started again on the same folder serves them again.

Run: python -m tests.storage.gcs_xml --port P --data DIR --token T --bucket B [--bucket B2 ...]
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from email.utils import formatdate, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_PART = re.compile(r"<PartNumber>(\d+)</PartNumber>")
_LIST_PAGE = 1000  # GCS's page size


class Store:
    """Buckets as folders: each object a data file plus a JSON of its metadata, both written by rename."""

    def __init__(self, root: Path):
        self.root = root
        self.lock = threading.Lock()

    def bucket(self, name: str) -> Path | None:
        folder = self.root / "buckets" / name
        return folder if folder.is_dir() else None

    def _files(self, bucket: Path, key: str) -> tuple[Path, Path]:
        name = base64.urlsafe_b64encode(key.encode()).decode()
        return bucket / f"{name}.data", bucket / f"{name}.json"

    def meta(self, bucket: Path, key: str) -> dict | None:
        _, meta = self._files(bucket, key)
        try:
            return json.loads(meta.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def read(self, bucket: Path, key: str) -> bytes:
        return self._files(bucket, key)[0].read_bytes()

    def write(self, bucket: Path, key: str, data: bytes) -> dict:
        data_file, meta_file = self._files(bucket, key)
        meta = {"key": key, "size": len(data), "etag": f'"{hashlib.md5(data).hexdigest()}"',
                "generation": str(time.time_ns() // 1000),  # GCS: microseconds since the epoch
                "modified": formatdate(usegmt=True)}
        token = uuid.uuid4().hex
        (bucket / f".{token}.data").write_bytes(data)
        (bucket / f".{token}.json").write_text(json.dumps(meta))
        os.replace(bucket / f".{token}.data", data_file)
        os.replace(bucket / f".{token}.json", meta_file)
        return meta

    def delete(self, bucket: Path, key: str) -> bool:
        data_file, meta_file = self._files(bucket, key)
        existed = meta_file.exists()
        meta_file.unlink(missing_ok=True)
        data_file.unlink(missing_ok=True)
        return existed

    def keys(self, bucket: Path) -> list[dict]:
        out = []
        for meta_file in bucket.glob("*.json"):
            if not meta_file.name.startswith("."):
                try:
                    out.append(json.loads(meta_file.read_text()))
                except (FileNotFoundError, ValueError):
                    pass
        return sorted(out, key=lambda m: m["key"])


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: object) -> None:  # quiet: the tests read failures, not a log
        pass

    # --- plumbing ---------------------------------------------------------------------------------

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None, head: bool = False) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and not head:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, head: bool = False) -> None:
        body = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{escape(message)}</Message>"
                "</Error>").encode()
        self._send(status, body, {"Content-Type": "application/xml; charset=UTF-8"}, head=head)

    def _route(self) -> tuple[Path | None, str, str, dict[str, list[str]]] | None:
        """(bucket folder, bucket name, key, query); None when the request was answered (auth, no bucket)."""
        parts = urlsplit(self.path)
        query = parse_qs(parts.query, keep_blank_values=True)
        bucket_name, _, key = parts.path.lstrip("/").partition("/")
        bucket_name, key = unquote(bucket_name), unquote(key)
        auth = self.headers.get("Authorization", "")
        head = self.command == "HEAD"
        if not auth.startswith("Bearer "):
            self._error(401, "AuthenticationRequired", "Authentication required.", head)
            return None
        if auth.removeprefix("Bearer ") != self.server.token:
            self._error(403, "AccessDenied", "Access denied: Invalid Credentials.", head)
            return None
        bucket = self.server.store.bucket(bucket_name)
        if bucket is None:
            self._error(404, "NoSuchBucket", "The specified bucket does not exist.", head)
            return None
        return bucket, bucket_name, key, query

    # --- verbs ------------------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        routed = self._route()
        if routed is None:
            return
        bucket, name, key, query = routed
        if not key:
            return self._list(bucket, name, query)
        head = self.command == "HEAD"
        meta = self.server.store.meta(bucket, key)
        if meta is None:
            return self._error(404, "NoSuchKey", "The specified key does not exist.", head)
        if_match, if_none = self.headers.get("If-Match"), self.headers.get("If-None-Match")
        if if_match and if_match.strip().strip('"') != meta["etag"].strip('"'):
            return self._error(412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold.", head)
        headers = {"ETag": meta["etag"], "Last-Modified": meta["modified"], "x-goog-generation": meta["generation"],
                   "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if if_none and if_none.strip().strip('"') == meta["etag"].strip('"'):
            return self._send(304, headers=headers, head=True)
        if head:  # the headers a GET would send, no body
            self.send_response(200)
            for name, value in {**headers, "Content-Length": str(meta["size"])}.items():
                self.send_header(name, value)
            self.end_headers()
            return None
        data = self.server.store.read(bucket, key)
        wanted = self.headers.get("Range")
        if wanted:
            found = _RANGE.match(wanted.strip())
            size = meta["size"]
            if not found or (found.group(1) == "" and found.group(2) == ""):
                return self._error(400, "InvalidArgument", f"Invalid range {wanted!r}.")
            if found.group(1) == "":  # bytes=-N: the last N bytes
                start, end = max(0, size - int(found.group(2))), size - 1
            else:
                start = int(found.group(1))
                end = min(size - 1, int(found.group(2))) if found.group(2) else size - 1
            if start >= size or end < start:
                return self._error(416, "InvalidRange", "The requested range cannot be satisfied.")
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            return self._send(206, data[start : end + 1], headers)
        return self._send(200, data, headers)

    def _list(self, bucket: Path, name: str, query: dict[str, list[str]]) -> None:
        if query.get("list-type", [""])[0] != "2":
            return self._error(400, "InvalidArgument", "Only list-type=2 is served here.")
        prefix = query.get("prefix", [""])[0]
        delimiter = query.get("delimiter", [""])[0]
        after = query.get("continuation-token", [""])[0] or query.get("start-after", [""])[0]
        limit = min(int(query.get("max-keys", [str(_LIST_PAGE)])[0]), _LIST_PAGE)
        contents, prefixes, truncated, last = [], [], False, ""
        for meta in self.server.store.keys(bucket):
            key = meta["key"]
            if not key.startswith(prefix) or (after and key <= after):
                continue
            if len(contents) + len(prefixes) >= limit:
                truncated = True
                break
            if delimiter and delimiter in key[len(prefix):]:
                common = key[: len(prefix) + key[len(prefix):].index(delimiter) + 1]
                if common not in prefixes:
                    prefixes.append(common)
                last = key
                continue
            contents.append(meta)
            last = key
        iso = "%Y-%m-%dT%H:%M:%S.000Z"
        items = "".join(
            f"<Contents><Key>{escape(m['key'])}</Key><Size>{m['size']}</Size>"
            f"<LastModified>{parsedate_to_datetime(m['modified']).strftime(iso)}</LastModified>"
            f"<ETag>{escape(m['etag'])}</ETag><Generation>{m['generation']}</Generation></Contents>" for m in contents)
        common = "".join(f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in prefixes)
        token = f"<NextContinuationToken>{escape(last)}</NextContinuationToken>" if truncated else ""
        body = (f"<?xml version='1.0' encoding='UTF-8'?><ListBucketResult xmlns='http://doc.s3.amazonaws.com/2006-03-01'>"
                f"<Name>{escape(name)}</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(contents)}</KeyCount>"
                f"<MaxKeys>{limit}</MaxKeys><IsTruncated>{str(truncated).lower()}</IsTruncated>{token}{items}{common}"
                "</ListBucketResult>").encode()
        self._send(200, body, {"Content-Type": "application/xml; charset=UTF-8"})

    def do_PUT(self) -> None:
        routed = self._route()
        if routed is None:
            self._body()
            return
        bucket, _, key, query = routed
        body = self._body()
        store = self.server.store
        if "uploadId" in query:
            upload = self.server.uploads.get(query["uploadId"][0])
            if upload is None:
                return self._error(404, "NoSuchUpload", "The specified upload does not exist.")
            etag = f'"{hashlib.md5(body).hexdigest()}"'
            upload["parts"][int(query["partNumber"][0])] = (etag, body)
            return self._send(200, headers={"ETag": etag})
        source = self.headers.get("x-goog-copy-source")
        if source is not None:
            src_bucket_name, _, src_key = unquote(source).lstrip("/").partition("/")
            src_bucket = store.bucket(src_bucket_name)
            if src_bucket is None or store.meta(src_bucket, src_key) is None:
                return self._error(404, "NoSuchKey", "The specified key does not exist.")
            body = store.read(src_bucket, src_key)
        with store.lock:  # the precondition and the write as one step, as GCS does
            wanted = self.headers.get("x-goog-if-generation-match")
            meta = store.meta(bucket, key)
            if wanted is not None and ((wanted == "0" and meta is not None) or
                                       (wanted != "0" and (meta is None or meta["generation"] != wanted))):
                return self._error(412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold.")
            meta = store.write(bucket, key, body)
        self._send(200, headers={"ETag": meta["etag"], "x-goog-generation": meta["generation"]})

    def do_POST(self) -> None:
        routed = self._route()
        if routed is None:
            self._body()
            return
        bucket, name, key, query = routed
        body = self._body()
        if "uploads" in query:
            upload_id = uuid.uuid4().hex
            self.server.uploads[upload_id] = {"key": key, "parts": {}}
            xml = (f"<?xml version='1.0' encoding='UTF-8'?><InitiateMultipartUploadResult><Bucket>{escape(name)}</Bucket>"
                   f"<Key>{escape(key)}</Key><UploadId>{upload_id}</UploadId></InitiateMultipartUploadResult>").encode()
            return self._send(200, xml, {"Content-Type": "application/xml"})
        if "uploadId" in query:
            upload = self.server.uploads.pop(query["uploadId"][0], None)
            if upload is None:
                return self._error(404, "NoSuchUpload", "The specified upload does not exist.")
            numbers = [int(n) for n in _PART.findall(body.decode())]
            if not numbers or any(n not in upload["parts"] for n in numbers):
                return self._error(400, "InvalidPart", "One or more of the specified parts could not be found.")
            with self.server.store.lock:
                meta = self.server.store.write(bucket, key, b"".join(upload["parts"][n][1] for n in numbers))
            xml = (f"<?xml version='1.0' encoding='UTF-8'?><CompleteMultipartUploadResult><Bucket>{escape(name)}</Bucket>"
                   f"<Key>{escape(key)}</Key><ETag>{escape(meta['etag'])}</ETag></CompleteMultipartUploadResult>").encode()
            return self._send(200, xml, {"Content-Type": "application/xml", "x-goog-generation": meta["generation"]})
        self._error(400, "InvalidArgument", "Unsupported POST.")

    def do_DELETE(self) -> None:
        routed = self._route()
        if routed is None:
            return
        bucket, _, key, query = routed
        if "uploadId" in query:
            self.server.uploads.pop(query["uploadId"][0], None)
            return self._send(204)
        with self.server.store.lock:
            existed = self.server.store.delete(bucket, key)
        if not existed:
            return self._error(404, "NoSuchKey", "The specified key does not exist.")
        self._send(204)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, root: Path, token: str, buckets: list[str]):
        self.store, self.token, self.uploads = Store(root), token, {}
        for bucket in buckets:
            (root / "buckets" / bucket).mkdir(parents=True, exist_ok=True)
        super().__init__(("127.0.0.1", port), Handler)


class GcsXmlServer:
    """This server in a process of its own on 127.0.0.1:`port`: start(), kill() (SIGKILL), start() again."""

    def __init__(self, root: Path, token: str, buckets: list[str]):
        self.root, self.token, self.buckets = Path(root).resolve(), token, buckets
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        cmd = [sys.executable, "-m", "tests.storage.gcs_xml", "--port", str(self.port), "--data", str(self.root / "data"),
               "--token", self.token, *(f"--bucket={b}" for b in self.buckets)]
        repo = Path(__file__).resolve().parents[2]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
        with open(self.root / "server.log", "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=repo, env=env,
                                         start_new_session=True)
        atexit.register(self.kill)  # also when the test run ends without its fixtures' teardown
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the GCS test server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"the GCS test server did not answer at {self.endpoint} within {timeout_s:.0f} s")

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.proc = None

    stop = kill  # nothing to flush: every write is on disk when answered

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return (self.root / "server.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--bucket", action="append", default=[])
    args = parser.parse_args()
    server = Server(args.port, args.data, args.token, args.bucket)
    print(f"serving on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
